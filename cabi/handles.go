package main

import (
	"sync"

	"github.com/gosym/gosym/gobackend"
)

// handleTable maps the uint64 handles given to C callers to Go objects;
// Go pointers never cross the ABI. Handle 0 is never issued.
type handleTable struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]any
}

var handles = handleTable{objs: map[uint64]any{}}

func (t *handleTable) add(v any) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.objs[t.next] = v
	return t.next
}

func (t *handleTable) get(h uint64) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.objs[h]
}

func (t *handleTable) remove(h uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.objs, h)
}

func (t *handleTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.objs)
}

// get returns handle h's object when it is a T (what names T in the error).
func get[T any](h uint64, what string) (T, error) {
	v, ok := handles.get(h).(T)
	if !ok {
		return v, gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is not a live %s handle", h, what)
	}
	return v, nil
}

// take is get that also removes the handle, under one lock: for the
// functions that release what a handle holds.
func take[T any](h uint64, what string) (T, error) {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	v, ok := handles.objs[h].(T)
	if !ok {
		return v, gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is not a live %s handle", h, what)
	}
	delete(handles.objs, h)
	return v, nil
}

func getEndpoint(h uint64) (*gobackend.Endpoint, error) {
	return get[*gobackend.Endpoint](h, "endpoint")
}
func getWork(h uint64) (*gobackend.Work, error) { return get[*gobackend.Work](h, "work") }
func getMemh(h uint64) (*gobackend.Memh, error) { return get[*gobackend.Memh](h, "memory") }
