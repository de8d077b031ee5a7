package cuda

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// cudaInclude finds a directory with cuda.h: $GOSYM_CUDA_INCLUDE, the
// include/ beside $GOSYM_NVRTC's lib/ (the nvidia pip wheels), CUDA_HOME.
func cudaInclude() string {
	var dirs []string
	if d := os.Getenv("GOSYM_CUDA_INCLUDE"); d != "" {
		dirs = append(dirs, d)
	}
	if p := os.Getenv("GOSYM_NVRTC"); p != "" {
		dirs = append(dirs, filepath.Join(filepath.Dir(filepath.Dir(p)), "include"))
	}
	if d := os.Getenv("CUDA_HOME"); d != "" {
		dirs = append(dirs, filepath.Join(d, "include"))
	}
	dirs = append(dirs, "/usr/local/cuda/include")
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "cuda.h")); err == nil {
			return d
		}
	}
	return ""
}

// TestHeaderMatchesCudaH compiles, against a real cuda.h, static assertions
// that the hand-declared types, constants and exported names of this
// package agree with it.
func TestHeaderMatchesCudaH(t *testing.T) {
	inc := cudaInclude()
	if inc == "" {
		t.Skip("no cuda.h found (set GOSYM_CUDA_INCLUDE)")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler")
	}
	var b strings.Builder
	b.WriteString("#include <stddef.h>\n#include <cuda.h>\n#define GSCU_IPC_HANDLE_SIZE CU_IPC_HANDLE_SIZE\n")
	check := func(expr string, v any) {
		fmt.Fprintf(&b, "_Static_assert((%s) == %v, \"%s\");\n", expr, v, strings.ReplaceAll(expr, "\"", "'"))
	}
	facts := abiFacts()
	keys := make([]string, 0, len(facts))
	for k := range facts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		check(k, facts[k])
	}
	for name, v := range map[string]int{
		"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK":                       int(AttrMaxThreadsPerBlock),
		"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT":                        int(AttrMultiprocessorCount),
		"CU_DEVICE_ATTRIBUTE_PCI_BUS_ID":                                  int(AttrPCIBusID),
		"CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID":                               int(AttrPCIDeviceID),
		"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR":              int(AttrMaxThreadsPerSM),
		"CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR":            int(AttrMaxRegistersPerSM),
		"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING":                          int(AttrUnifiedAddressing),
		"CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID":                               int(AttrPCIDomainID),
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR":                    int(AttrComputeCapabilityMajor),
		"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR":                    int(AttrComputeCapabilityMinor),
		"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN":           int(AttrMaxSharedMemPerBlockOptin),
		"CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED":         int(AttrVirtualMemoryManagement),
		"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": int(AttrHandleTypePosixFD),
		"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS":               int(AttrCanUse64BitStreamMemOps),
		"CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED":                int(AttrHandleTypeFabric),
		"CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED":                         int(AttrMulticastSupported),
		"CU_POINTER_ATTRIBUTE_CONTEXT":                                    PointerContext,
		"CU_POINTER_ATTRIBUTE_MEMORY_TYPE":                                PointerMemoryType,
		"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL":                             PointerDeviceOrdinal,
		"CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE":                 PointerLegacyIPCCapable,
		"CU_POINTER_ATTRIBUTE_RANGE_START_ADDR":                           PointerRangeStart,
		"CU_POINTER_ATTRIBUTE_RANGE_SIZE":                                 PointerRangeSize,
		"CU_POINTER_ATTRIBUTE_MAPPED":                                     PointerMapped,
		"CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES":                       PointerAllowedHandles,
		"CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK":                         FuncMaxThreadsPerBlock,
		"CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES":                             FuncSharedSizeBytes,
		"CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES":                              FuncLocalSizeBytes,
		"CU_FUNC_ATTRIBUTE_NUM_REGS":                                      FuncNumRegs,
		"CU_MEM_HANDLE_TYPE_NONE":                                         HandleTypeNone,
		"CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR":                        HandleTypePosixFD,
		"CU_MEM_HANDLE_TYPE_FABRIC":                                       HandleTypeFabric,
		"CU_MEM_ALLOCATION_TYPE_PINNED":                                   1,
		"CU_MEM_LOCATION_TYPE_DEVICE":                                     1,
		"CU_MEM_ACCESS_FLAGS_PROT_READWRITE":                              3,
		"CU_STREAM_MEM_OP_WAIT_VALUE_32":                                  1,
		"CU_STREAM_MEM_OP_WRITE_VALUE_32":                                 2,
		"CU_STREAM_WAIT_VALUE_GEQ":                                        WaitGEQ,
		"CU_STREAM_WAIT_VALUE_EQ":                                         WaitEQ,
		"CU_STREAM_WAIT_VALUE_AND":                                        WaitAND,
		"CU_STREAM_WAIT_VALUE_NOR":                                        WaitNOR,
		"CU_STREAM_NON_BLOCKING":                                          StreamNonBlocking,
		"CU_EVENT_DISABLE_TIMING":                                         EventDisableTiming,
		"CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS":                              IpcLazyEnablePeerAccess,
		"CU_GET_PROC_ADDRESS_SUCCESS":                                     0,
	} {
		check(name, v)
	}
	for code, name := range resultNames {
		if code >= 0 {
			check(name, code)
		}
	}
	compileC(t, cc, inc, b.String())

	// Every dlsym name is an export cuda.h declares, so the fallback path
	// looks up real functions. The library's own view of the header
	// declares every version (newer headers hide some v1 names otherwise).
	b.Reset()
	b.WriteString("#define __CUDA_API_VERSION_INTERNAL 1\n#include <cuda.h>\n")
	syms := driverSymbols()
	names := make([]string, 0, len(syms))
	for name := range syms {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&b, "static void *const check_%s = (void *)&%s;\n", name, syms[name])
	}
	compileC(t, cc, inc, b.String())
}

func compileC(t *testing.T, cc, inc, src string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "check.c")
	require.NoError(t, os.WriteFile(file, []byte(src), 0o644))
	out, err := exec.Command(cc, "-std=gnu11", "-fsyntax-only", "-Wno-deprecated-declarations",
		"-I", inc, file).CombinedOutput()
	require.NoError(t, err, "cuda.h in %s disagrees:\n%s", inc, out)
}
