// Package status carries the engine's error classes to the C ABI, where
// each becomes a GOSYM_ERR_* code and, in Python, an exception type.
package status

import (
	"errors"
	"fmt"
)

// Code is an ABI status code; the values are mirrored in cabi/gosym.h.
type Code int32

// Status codes (GOSYM_OK, GOSYM_ERR_*).
const (
	OK            Code = 0
	InvalidArg    Code = -1
	InvalidHandle Code = -2
	Timeout       Code = -3
	Peer          Code = -4
	Mismatch      Code = -5
	NotSupported  Code = -6
	System        Code = -7
	Internal      Code = -8
	NotReady      Code = -9
	Closed        Code = -10
)

// Error is an error with an ABI code.
type Error struct {
	Code Code
	Msg  string
	Err  error // optional cause
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Msg + ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf makes an *Error with a formatted message.
func Errorf(c Code, format string, args ...any) error {
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...)}
}

// Wrap attaches a code to err (nil stays nil).
func Wrap(c Code, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Code: c, Msg: fmt.Sprintf(format, args...), Err: err}
}

// CodeOf returns err's code: OK for nil, System for an error without one.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return System
}
