package gobackend

import (
	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// Types and codes the C ABI needs, re-exported so that cabi never imports
// the engine's internals.
type (
	// Kind is an operation (GOSYM_OP_*).
	Kind = ops.Kind
	// DType is an element type (GOSYM_DTYPE_*).
	DType = dtype.DType
	// RedOp is a reduction operator (GOSYM_RED_*).
	RedOp = dtype.RedOp
	// Code is an ABI status code (GOSYM_OK, GOSYM_ERR_*).
	Code = status.Code
)

// Status codes used by the C ABI itself.
const (
	CodeOK            = status.OK
	CodeInvalidArg    = status.InvalidArg
	CodeInvalidHandle = status.InvalidHandle
	CodeInternal      = status.Internal
	CodeNotReady      = status.NotReady
)

// CodeOf maps an error to its status code.
func CodeOf(err error) Code { return status.CodeOf(err) }

// Errorf makes an error with a status code.
func Errorf(c Code, format string, args ...any) error { return status.Errorf(c, format, args...) }
