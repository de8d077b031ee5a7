package cuda

/*
#include <stddef.h>
#include "dispatch.h"

// Sizes and offsets of the types dispatch.h declares by hand, each next to
// the cuda.h expression it must equal (checked by TestHeaderMatchesCudaH).
typedef struct {
	const char *expr;
	size_t value;
} gscu_fact;

static const gscu_fact gscu_facts[] = {
	{"sizeof(CUdeviceptr)", sizeof(CUdeviceptr)},
	{"sizeof(CUresult)", sizeof(CUresult)},
	{"sizeof(CUdevice)", sizeof(CUdevice)},
	{"sizeof(CUmemGenericAllocationHandle)", sizeof(CUmemGenericAllocationHandle)},
	{"sizeof(CUipcMemHandle)", sizeof(CUipcMemHandle)},
	{"sizeof(CUmemLocation)", sizeof(CUmemLocation)},
	{"offsetof(CUmemLocation, id)", offsetof(CUmemLocation, id)},
	{"sizeof(CUmemAllocationProp)", sizeof(CUmemAllocationProp)},
	{"offsetof(CUmemAllocationProp, requestedHandleTypes)", offsetof(CUmemAllocationProp, requestedHandleTypes)},
	{"offsetof(CUmemAllocationProp, location)", offsetof(CUmemAllocationProp, location)},
	{"offsetof(CUmemAllocationProp, win32HandleMetaData)", offsetof(CUmemAllocationProp, win32HandleMetaData)},
	{"offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable)", offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable)},
	{"sizeof(CUmemAccessDesc)", sizeof(CUmemAccessDesc)},
	{"offsetof(CUmemAccessDesc, flags)", offsetof(CUmemAccessDesc, flags)},
	{"sizeof(CUmulticastObjectProp)", sizeof(CUmulticastObjectProp)},
	{"offsetof(CUmulticastObjectProp, size)", offsetof(CUmulticastObjectProp, size)},
	{"offsetof(CUmulticastObjectProp, handleTypes)", offsetof(CUmulticastObjectProp, handleTypes)},
	{"offsetof(CUmulticastObjectProp, flags)", offsetof(CUmulticastObjectProp, flags)},
	{"sizeof(CUstreamBatchMemOpParams)", sizeof(CUstreamBatchMemOpParams)},
	{"offsetof(CUstreamBatchMemOpParams, waitValue.address)", offsetof(CUstreamBatchMemOpParams, value.address)},
	{"offsetof(CUstreamBatchMemOpParams, waitValue.value)", offsetof(CUstreamBatchMemOpParams, value.v.value)},
	{"offsetof(CUstreamBatchMemOpParams, waitValue.flags)", offsetof(CUstreamBatchMemOpParams, value.flags)},
	{"offsetof(CUstreamBatchMemOpParams, writeValue.address)", offsetof(CUstreamBatchMemOpParams, value.address)},
	{"offsetof(CUstreamBatchMemOpParams, writeValue.value)", offsetof(CUstreamBatchMemOpParams, value.v.value)},
	{"offsetof(CUstreamBatchMemOpParams, writeValue.flags)", offsetof(CUstreamBatchMemOpParams, value.flags)},
	{"sizeof(CUlaunchAttributeValue)", sizeof(CUlaunchAttributeValue)},
	{"sizeof(CUlaunchAttribute)", sizeof(CUlaunchAttribute)},
	{"offsetof(CUlaunchAttribute, value)", offsetof(CUlaunchAttribute, value)},
	{"offsetof(CUlaunchAttribute, value.programmaticStreamSerializationAllowed)", offsetof(CUlaunchAttribute, value.programmaticStreamSerializationAllowed)},
	{"sizeof(CUlaunchConfig)", sizeof(CUlaunchConfig)},
	{"offsetof(CUlaunchConfig, sharedMemBytes)", offsetof(CUlaunchConfig, sharedMemBytes)},
	{"offsetof(CUlaunchConfig, hStream)", offsetof(CUlaunchConfig, hStream)},
	{"offsetof(CUlaunchConfig, attrs)", offsetof(CUlaunchConfig, attrs)},
	{"offsetof(CUlaunchConfig, numAttrs)", offsetof(CUlaunchConfig, numAttrs)},
	{"(size_t)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION", GSCU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION},
	{"GSCU_IPC_HANDLE_SIZE", GSCU_IPC_HANDLE_SIZE},
	{"(size_t)CU_GET_PROC_ADDRESS_LEGACY_STREAM", GSCU_GET_PROC_ADDRESS_LEGACY_STREAM},
};

static int gscu_num_facts(void) { return sizeof gscu_facts / sizeof gscu_facts[0]; }
static const gscu_fact *gscu_fact_at(int i) { return &gscu_facts[i]; }
*/
import "C"

// abiFacts lists (cuda.h expression, value in dispatch.h) pairs.
func abiFacts() map[string]uintptr {
	out := map[string]uintptr{}
	for i := C.int(0); i < C.gscu_num_facts(); i++ {
		f := C.gscu_fact_at(i)
		out[C.GoString(f.expr)] = uintptr(f.value)
	}
	return out
}

// driverSymbols lists every driver function of the dispatch table with the
// name it is exported under (what dlsym looks for).
func driverSymbols() map[string]string {
	out := map[string]string{}
	for i := 0; i < int(C.GSCU_NUM_DRIVER_FUNCS); i++ {
		out[C.GoString(C.gscu_driver_sym_name(C.int(i)))] = C.GoString(C.gscu_driver_sym_dlname(C.int(i)))
	}
	return out
}
