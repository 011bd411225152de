/*
 * kb_opencl_remote — the public accessors of kb_opencl.h that a device server's session
 * (kb_remote.h, cl/devd/) answers as well as a local OpenCL backend: kernel launches, kernel
 * time and set-up figures. The one place the OpenCL backend meets the device client: a remote
 * backend forwards to kb_remote, any other to the local backend's figures (kb_opencl.c). Limits:
 * a backend of neither kind answers 0 / KB_ERR_INVAL.
 */
#include "kb_opencl.h"
#include "kb_opencl_int.h"
#include "kb_remote.h"

/* The accessors answer for a device server's session too (kb_remote.h). */
uint64_t kb_opencl_launches(const kb_backend *be)
{
    return kb_remote_is(be) ? kb_remote_launches(be) : kb_ocl_launches_of(be);
}

double kb_opencl_kernel_ms(const kb_backend *be)
{
    return kb_remote_is(be) ? kb_remote_kernel_ms(be) : kb_ocl_kernel_ms_of(be);
}

int kb_opencl_setup_of(const kb_backend *be, kb_opencl_setup *out)
{
    return kb_remote_is(be) ? kb_remote_setup_of(be, out) : kb_ocl_setup_of(be, out);
}
