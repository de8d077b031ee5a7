// Package dtype names the element types and reduction operators that cross
// the C ABI. The numeric values are part of the ABI (cabi/gosym.h) and must
// not change.
package dtype

import "fmt"

// DType is an element type.
type DType int32

// Element types, mirrored in cabi/gosym.h (GOSYM_DTYPE_*).
const (
	Float32 DType = iota
	Float64
	Float16
	BFloat16
	Int8
	Uint8
	Int16
	Int32
	Int64
	Bool
	// Float8E4M3 and Float8E5M2 are torch's float8_e4m3fn and float8_e5m2
	// (OCP FP8), which NCCL 2.28 reduces with float accumulation on CUDA;
	// the host data plane moves them but does not reduce them (Gloo does not).
	Float8E4M3
	Float8E5M2
	numDTypes
)

var dtypeInfo = [numDTypes]struct {
	name string
	size int
}{
	Float32:    {"float32", 4},
	Float64:    {"float64", 8},
	Float16:    {"float16", 2},
	BFloat16:   {"bfloat16", 2},
	Int8:       {"int8", 1},
	Uint8:      {"uint8", 1},
	Int16:      {"int16", 2},
	Int32:      {"int32", 4},
	Int64:      {"int64", 8},
	Bool:       {"bool", 1},
	Float8E4M3: {"float8_e4m3fn", 1},
	Float8E5M2: {"float8_e5m2", 1},
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d >= 0 && d < numDTypes }

// Size is the element size in bytes (0 for an invalid type).
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", int32(d))
	}
	return dtypeInfo[d].name
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float32 || d == Float64 || d == Float16 || d == BFloat16 || d.IsFloat8()
}

// IsFloat8 reports whether d is one of the fp8 types.
func (d DType) IsFloat8() bool { return d == Float8E4M3 || d == Float8E5M2 }

// RedOp is a reduction operator.
type RedOp int32

// Reduction operators, mirrored in cabi/gosym.h (GOSYM_RED_*).
const (
	Sum RedOp = iota
	Avg
	Product
	Min
	Max
	PremulSum
	BAnd
	BOr
	BXor
	numRedOps
)

var redOpNames = [numRedOps]string{"SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM", "BAND", "BOR", "BXOR"}

// Valid reports whether o is a known operator.
func (o RedOp) Valid() bool { return o >= 0 && o < numRedOps }

func (o RedOp) String() string {
	if !o.Valid() {
		return fmt.Sprintf("redop(%d)", int32(o))
	}
	return redOpNames[o]
}

// Supports reports whether operator o is defined on type d, and why not.
// AVG and PREMUL_SUM need a floating type; bitwise ops need an integer or
// bool type.
func Supports(d DType, o RedOp) error {
	switch {
	case !d.Valid():
		return fmt.Errorf("unknown dtype %d", int32(d))
	case !o.Valid():
		return fmt.Errorf("unknown reduce op %d", int32(o))
	case (o == Avg || o == PremulSum) && !d.IsFloat():
		return fmt.Errorf("reduce op %s needs a floating-point dtype, got %s", o, d)
	case (o == BAnd || o == BOr || o == BXor) && d.IsFloat():
		return fmt.Errorf("reduce op %s needs an integer or bool dtype, got %s", o, d)
	}
	return nil
}
