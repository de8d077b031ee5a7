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

func getEndpoint(h uint64) (*gobackend.Endpoint, error) {
	if ep, ok := handles.get(h).(*gobackend.Endpoint); ok {
		return ep, nil
	}
	return nil, gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is not a live endpoint handle", h)
}

func getWork(h uint64) (*gobackend.Work, error) {
	if w, ok := handles.get(h).(*gobackend.Work); ok {
		return w, nil
	}
	return nil, gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is not a live work handle", h)
}

func getMemh(h uint64) (*gobackend.Memh, error) {
	if m, ok := handles.get(h).(*gobackend.Memh); ok {
		return m, nil
	}
	return nil, gobackend.Errorf(gobackend.CodeInvalidHandle, "gosym: %d is not a live memory handle", h)
}

// take removes handle h and returns its object when it is a T (what names
// T in the error): for the functions that release what a handle holds.
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
