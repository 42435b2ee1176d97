/* A stand-in for libdeepinfer_cuda.so, compiled by the tests to check how
 * the Go side handles libraries it cannot use. FAKE_MODE selects:
 *   1: built against another ABI version,
 *   2: a well-formed table whose create reports no device,
 *   3: no di_get_api symbol at all. */
#include <stdio.h>
#include <string.h>
#include "deepinfer_cuda.h"

#if FAKE_MODE == 2
static int fake_create(int device, di_ctx **out, char *err, int errlen) {
	(void)device;
	*out = 0;
	snprintf(err, (size_t)errlen, "cudaGetDeviceCount: no CUDA-capable device is detected (fake)");
	return DI_ERR_NO_DEVICE;
}
#endif

#if FAKE_MODE != 3
int di_get_api(uint32_t abi_version, di_api *out) {
#if FAKE_MODE == 1
	(void)abi_version;
	out->abi_version = 999;
	return DI_ERR_UNSUPPORTED;
#else
	if (abi_version != DI_ABI_VERSION) return DI_ERR_UNSUPPORTED;
	memset(out, 0, sizeof *out);
	out->abi_version = DI_ABI_VERSION;
	out->size = sizeof *out;
	out->create = fake_create;
	return DI_OK;
#endif
}
#else
int not_the_entry_point(void) { return 0; }
#endif
