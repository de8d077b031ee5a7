package gobackend

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gosym/gosym/gobackend/internal/dtype"
	"github.com/gosym/gosym/gobackend/internal/ops"
	"github.com/gosym/gosym/gobackend/internal/status"
)

// goABI is the engine's value of every constant cabi/gosym.h defines for
// the ABI's enums, by its name there. gosym.h is the source: cabi reads
// GOSYM_ABI_VERSION and GOSYM_OP_CAPTURING from it directly (cgo), and
// TestABIConstants holds the engine's enums and python/gosym/_lib.py to it.
var goABI = map[string]int64{
	"GOSYM_OK": int64(status.OK), "GOSYM_ERR_INVALID_ARG": int64(status.InvalidArg),
	"GOSYM_ERR_INVALID_HANDLE": int64(status.InvalidHandle), "GOSYM_ERR_TIMEOUT": int64(status.Timeout),
	"GOSYM_ERR_PEER": int64(status.Peer), "GOSYM_ERR_MISMATCH": int64(status.Mismatch),
	"GOSYM_ERR_NOT_SUPPORTED": int64(status.NotSupported), "GOSYM_ERR_SYSTEM": int64(status.System),
	"GOSYM_ERR_INTERNAL": int64(status.Internal), "GOSYM_ERR_NOT_READY": int64(status.NotReady),
	"GOSYM_ERR_CLOSED": int64(status.Closed),

	"GOSYM_DTYPE_FLOAT32": int64(dtype.Float32), "GOSYM_DTYPE_FLOAT64": int64(dtype.Float64),
	"GOSYM_DTYPE_FLOAT16": int64(dtype.Float16), "GOSYM_DTYPE_BFLOAT16": int64(dtype.BFloat16),
	"GOSYM_DTYPE_INT8": int64(dtype.Int8), "GOSYM_DTYPE_UINT8": int64(dtype.Uint8),
	"GOSYM_DTYPE_INT16": int64(dtype.Int16), "GOSYM_DTYPE_INT32": int64(dtype.Int32),
	"GOSYM_DTYPE_INT64": int64(dtype.Int64), "GOSYM_DTYPE_BOOL": int64(dtype.Bool),
	"GOSYM_DTYPE_FLOAT8_E4M3FN": int64(dtype.Float8E4M3), "GOSYM_DTYPE_FLOAT8_E5M2": int64(dtype.Float8E5M2),

	"GOSYM_RED_SUM": int64(dtype.Sum), "GOSYM_RED_AVG": int64(dtype.Avg), "GOSYM_RED_PRODUCT": int64(dtype.Product),
	"GOSYM_RED_MIN": int64(dtype.Min), "GOSYM_RED_MAX": int64(dtype.Max), "GOSYM_RED_PREMUL_SUM": int64(dtype.PremulSum),
	"GOSYM_RED_BAND": int64(dtype.BAnd), "GOSYM_RED_BOR": int64(dtype.BOr), "GOSYM_RED_BXOR": int64(dtype.BXor),

	"GOSYM_OP_BARRIER": int64(ops.Barrier), "GOSYM_OP_ALLREDUCE": int64(ops.AllReduce),
	"GOSYM_OP_REDUCE": int64(ops.Reduce), "GOSYM_OP_BROADCAST": int64(ops.Broadcast),
	"GOSYM_OP_ALLGATHER": int64(ops.AllGather), "GOSYM_OP_REDUCE_SCATTER": int64(ops.ReduceScatter),
	"GOSYM_OP_ALLTOALL": int64(ops.AllToAll), "GOSYM_OP_GATHER": int64(ops.Gather),
	"GOSYM_OP_SCATTER": int64(ops.Scatter), "GOSYM_OP_SEND": int64(ops.Send), "GOSYM_OP_RECV": int64(ops.Recv),
	"GOSYM_ANY_SOURCE": int64(ops.AnySource),
}

// headerABI parses the integer #defines of cabi/gosym.h: "#define NAME 1",
// "(-1)" and "1u" forms.
func headerABI(t *testing.T) map[string]int64 {
	b, err := os.ReadFile("../cabi/gosym.h")
	require.NoError(t, err)
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`(?m)^#define (GOSYM_[A-Z0-9_]+) \(?(-?\d+)u?\)?`).FindAllSubmatch(b, -1) {
		v, err := strconv.ParseInt(string(m[2]), 10, 64)
		require.NoError(t, err)
		out[string(m[1])] = v
	}
	return out
}

// pythonABI parses python/gosym/_lib.py's copies: NAME = value at the top
// level (named as gosym.h without GOSYM_), and RED's "NAME": value entries.
func pythonABI(t *testing.T) map[string]int64 {
	b, err := os.ReadFile("../python/gosym/_lib.py")
	require.NoError(t, err)
	out := map[string]int64{}
	for _, m := range regexp.MustCompile(`(?m)^(OK|ANY_SOURCE|ERR_[A-Z_]+|DTYPE_[A-Z0-9_]+|OP_[A-Z_]+|ABI_VERSION) = (-?\d+)`).FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseInt(string(m[2]), 10, 64)
		out["GOSYM_"+string(m[1])] = v
	}
	red := regexp.MustCompile(`(?s)\nRED = \{(.*?)\}`).FindSubmatch(b)
	require.NotNil(t, red, "RED = {...} in _lib.py")
	for _, m := range regexp.MustCompile(`"([A-Z_]+)": (\d+)`).FindAllSubmatch(red[1], -1) {
		v, _ := strconv.ParseInt(string(m[2]), 10, 64)
		out["GOSYM_RED_"+string(m[1])] = v
	}
	return out
}

// TestABIConstants: the engine's enums and python/gosym/_lib.py hold
// exactly gosym.h's values, no constant missing on any side.
func TestABIConstants(t *testing.T) {
	h, py := headerABI(t), pythonABI(t)
	require.Equal(t, int64(1), h["GOSYM_ABI_VERSION"])
	require.Contains(t, h, "GOSYM_OP_CAPTURING")
	enums := map[string]int64{}
	for name, v := range h {
		if name != "GOSYM_ABI_VERSION" && name != "GOSYM_OP_CAPTURING" && name != "GOSYM_H" {
			enums[name] = v
		}
	}
	require.Greater(t, len(enums), 40, "gosym.h's enums (status, dtype, red op, op kind) parsed")
	require.Equal(t, enums, goABI, "the engine's enums against cabi/gosym.h")
	require.Equal(t, h, py, "python/gosym/_lib.py against cabi/gosym.h")

	// The engine's names follow: every Go value is one the engine knows.
	for name, v := range enums {
		switch {
		case strings.HasPrefix(name, "GOSYM_DTYPE_"):
			require.True(t, dtype.DType(v).Valid(), name)
		case strings.HasPrefix(name, "GOSYM_RED_"):
			require.True(t, dtype.RedOp(v).Valid(), name)
		}
	}
}
