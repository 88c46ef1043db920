// Generated once from opencl-sys 0.6.5 `cl_icd.rs` and `cl_function_types.rs` by
// `opencl/tools/gen_icd_slots.py`. Do not edit by hand.
//
// One row per slot of `_cl_icd_dispatch`, in order: the function's name, whether it
// returns a pointer (and so must return NULL when unsupported), and the index of its
// `errcode_ret` argument if it has one.

/// A slot of the ICD dispatch table.
pub(crate) struct Slot {
    pub name: &'static str,
    pub returns_pointer: bool,
    pub errcode_arg: Option<usize>,
}

pub(crate) const SLOT_COUNT: usize = 150;

pub(crate) const SLOTS: [Slot; SLOT_COUNT] = [
    Slot {
        name: "clGetPlatformIDs",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetPlatformInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetDeviceIDs",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetDeviceInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateContext",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clCreateContextFromType",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clRetainContext",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseContext",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetContextInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateCommandQueue",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clRetainCommandQueue",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseCommandQueue",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetCommandQueueInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetCommandQueueProperty",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateBuffer",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCreateImage2D",
        returns_pointer: true,
        errcode_arg: Some(7),
    },
    Slot {
        name: "clCreateImage3D",
        returns_pointer: true,
        errcode_arg: Some(9),
    },
    Slot {
        name: "clRetainMemObject",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseMemObject",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetSupportedImageFormats",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetMemObjectInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetImageInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateSampler",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clRetainSampler",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseSampler",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetSamplerInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateProgramWithSource",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCreateProgramWithBinary",
        returns_pointer: true,
        errcode_arg: Some(6),
    },
    Slot {
        name: "clRetainProgram",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseProgram",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clBuildProgram",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clUnloadCompiler",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetProgramInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetProgramBuildInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateKernel",
        returns_pointer: true,
        errcode_arg: Some(2),
    },
    Slot {
        name: "clCreateKernelsInProgram",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clRetainKernel",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseKernel",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetKernelArg",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelWorkGroupInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clWaitForEvents",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetEventInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clRetainEvent",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseEvent",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetEventProfilingInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clFlush",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clFinish",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReadBuffer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueWriteBuffer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueCopyBuffer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReadImage",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueWriteImage",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueCopyImage",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueCopyImageToBuffer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueCopyBufferToImage",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueMapBuffer",
        returns_pointer: true,
        errcode_arg: Some(9),
    },
    Slot {
        name: "clEnqueueMapImage",
        returns_pointer: true,
        errcode_arg: Some(11),
    },
    Slot {
        name: "clEnqueueUnmapMemObject",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueNDRangeKernel",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueTask",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueNativeKernel",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueMarker",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueWaitForEvents",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueBarrier",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetExtensionFunctionAddress",
        returns_pointer: true,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateFromGLBuffer",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clCreateFromGLTexture2D",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clCreateFromGLTexture3D",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clCreateFromGLRenderbuffer",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clGetGLObjectInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetGLTextureInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueAcquireGLObjects",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReleaseGLObjects",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetGLContextInfoKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetDeviceIDsFromD3D10KHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateFromD3D10BufferKHR",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clCreateFromD3D10Texture2DKHR",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCreateFromD3D10Texture3DKHR",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clEnqueueAcquireD3D10ObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReleaseD3D10ObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetEventCallback",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateSubBuffer",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clSetMemObjectDestructorCallback",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateUserEvent",
        returns_pointer: true,
        errcode_arg: Some(1),
    },
    Slot {
        name: "clSetUserEventStatus",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReadBufferRect",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueWriteBufferRect",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueCopyBufferRect",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateSubDevicesEXT",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clRetainDeviceEXT",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseDeviceEXT",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateEventFromGLsyncKHR",
        returns_pointer: true,
        errcode_arg: Some(2),
    },
    Slot {
        name: "clCreateSubDevices",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clRetainDevice",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clReleaseDevice",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateImage",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clCreateProgramWithBuiltInKernels",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCompileProgram",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clLinkProgram",
        returns_pointer: true,
        errcode_arg: Some(8),
    },
    Slot {
        name: "clUnloadPlatformCompiler",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelArgInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueFillBuffer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueFillImage",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueMigrateMemObjects",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueMarkerWithWaitList",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueBarrierWithWaitList",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetExtensionFunctionAddressForPlatform",
        returns_pointer: true,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateFromGLTexture",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clGetDeviceIDsFromD3D11KHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateFromD3D11BufferKHR",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clCreateFromD3D11Texture2DKHR",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCreateFromD3D11Texture3DKHR",
        returns_pointer: true,
        errcode_arg: Some(4),
    },
    Slot {
        name: "clCreateFromDX9MediaSurfaceKHR",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clEnqueueAcquireD3D11ObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReleaseD3D11ObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetDeviceIDsFromDX9MediaAdapterKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueAcquireDX9MediaSurfacesKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReleaseDX9MediaSurfacesKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateFromEGLImageKHR",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clEnqueueAcquireEGLObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueReleaseEGLObjectsKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateEventFromEGLSyncKHR",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clCreateCommandQueueWithProperties",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clCreatePipe",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clGetPipeInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSVMAlloc",
        returns_pointer: true,
        errcode_arg: None,
    },
    Slot {
        name: "clSVMFree",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueSVMFree",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueSVMMemcpy",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueSVMMemFill",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueSVMMap",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clEnqueueSVMUnmap",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateSamplerWithProperties",
        returns_pointer: true,
        errcode_arg: Some(2),
    },
    Slot {
        name: "clSetKernelArgSVMPointer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetKernelExecInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelSubGroupInfoKHR",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCloneKernel",
        returns_pointer: true,
        errcode_arg: Some(1),
    },
    Slot {
        name: "clCreateProgramWithIL",
        returns_pointer: true,
        errcode_arg: Some(3),
    },
    Slot {
        name: "clEnqueueSVMMigrateMem",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetDeviceAndHostTimer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetHostTimer",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelSubGroupInfo",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetDefaultDeviceCommandQueue",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetProgramReleaseCallback",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clSetProgramSpecializationConstant",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clCreateBufferWithProperties",
        returns_pointer: true,
        errcode_arg: Some(5),
    },
    Slot {
        name: "clCreateImageWithProperties",
        returns_pointer: true,
        errcode_arg: Some(6),
    },
    Slot {
        name: "clSetContextDestructorCallback",
        returns_pointer: false,
        errcode_arg: None,
    },
    Slot {
        name: "clGetKernelSuggestedLocalWorkSize",
        returns_pointer: false,
        errcode_arg: None,
    },
];
