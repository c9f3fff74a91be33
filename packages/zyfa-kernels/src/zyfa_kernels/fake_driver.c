/* A stand-in for libcuda.so.1 and libamdhip64.so that tests build with `cc` and point the loader at
 * (ZYFA_CUDA_DRIVER / ZYFA_HIP_DRIVER). It implements the entry points the loader uses and appends one JSON line
 * per call to the file named by ZYFA_FAKE_DRIVER_LOG: {"call": name, "result": code, ...arguments}.
 *
 * Configuration, read from the environment at every call:
 *   ZYFA_FAKE_DRIVER_FAIL        "call:code[,call:code...]": that call returns that error code
 *   ZYFA_FAKE_DRIVER_DEVICES     number of devices (default 2)
 *   ZYFA_FAKE_DRIVER_MAX_SHARED  shared memory per block a kernel may use (default 232448, an H100/H200)
 *   ZYFA_FAKE_DRIVER_SMS         multiprocessors per device (default 132)
 *
 * A code object here is NUL-terminated text: "ZYFA-FAKE symbols=a,b params=0:8,8:4,64:128", naming the
 * functions it holds and, optionally, the (offset:size) of each parameter that cuFuncGetParamInfo reports.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SUCCESS 0
#define ERROR_INVALID_VALUE 1
#define ERROR_NOT_INITIALIZED 3
#define ERROR_INVALID_DEVICE 101
#define ERROR_INVALID_IMAGE 200
#define ERROR_INVALID_CONTEXT 201
#define ERROR_INVALID_HANDLE 400
#define ERROR_NOT_FOUND 500

#define IMAGE_MAGIC "ZYFA-FAKE"
#define MAX_DEVICES 64
#define MAX_NAME 128
#define MAX_PARAMS 64
#define DEFAULT_DEVICES 2
#define DEFAULT_MAX_SHARED 232448
#define DEFAULT_SMS 132
#define DEFAULT_SHARED_LIMIT 49152 /* dynamic shared memory a CUDA kernel gets without opting in */
#define TENSOR_MAP_BYTES 128

/* Attribute numbers the loader asks for (CUDA / HIP). */
#define CU_ATTR_MAX_THREADS_PER_BLOCK 1
#define CU_ATTR_WARP_SIZE 10
#define CU_ATTR_MULTIPROCESSOR_COUNT 16
#define CU_ATTR_L2_CACHE_SIZE 38
#define CU_ATTR_CC_MAJOR 75
#define CU_ATTR_CC_MINOR 76
#define CU_ATTR_MAX_SHARED_OPTIN 97
#define CU_FUNC_ATTR_MAX_DYNAMIC_SHARED 8
#define HIP_ATTR_L2_CACHE_SIZE 19
#define HIP_ATTR_MAX_THREADS_PER_BLOCK 56
#define HIP_ATTR_MULTIPROCESSOR_COUNT 63
#define HIP_ATTR_MAX_SHARED_PER_BLOCK 74
#define HIP_ATTR_WARP_SIZE 87

#define FAKE_MAX_THREADS 1024
#define FAKE_L2_BYTES (50 * 1024 * 1024)
#define CUDA_WARP 32
#define HIP_WAVE 64

typedef struct {
    int device;
} Context;

typedef struct {
    int device;
    char *image;
} Module;

typedef struct {
    Module *module;
    char name[MAX_NAME];
    int max_dynamic_shared;
} Function;

static Context primary_contexts[MAX_DEVICES];
static __thread Context *current_context;
static __thread int hip_current_device;
static int initialised;
static pthread_mutex_t log_mutex = PTHREAD_MUTEX_INITIALIZER;

static int env_int(const char *name, int fallback) {
    const char *value = getenv(name);
    return value != NULL && *value != '\0' ? atoi(value) : fallback;
}

static int device_count(void) {
    int n = env_int("ZYFA_FAKE_DRIVER_DEVICES", DEFAULT_DEVICES);
    return n > MAX_DEVICES ? MAX_DEVICES : n;
}

/* The error code configured for `call` in ZYFA_FAKE_DRIVER_FAIL, else SUCCESS. */
static int injected(const char *call) {
    const char *spec = getenv("ZYFA_FAKE_DRIVER_FAIL");
    size_t length = strlen(call);
    while (spec != NULL && *spec != '\0') {
        if (strncmp(spec, call, length) == 0 && spec[length] == ':') return atoi(spec + length + 1);
        spec = strchr(spec, ',');
        if (spec != NULL) ++spec;
    }
    return SUCCESS;
}

/* ---- one JSON line per call ---- */

typedef struct {
    char *text;
    size_t length, capacity;
    int on; /* whether ZYFA_FAKE_DRIVER_LOG names a file: without one nothing is formatted (a cheap launch) */
} Record;

static void append(Record *r, const char *s, size_t n) {
    if (!r->on) return;
    if (r->length + n + 1 > r->capacity) {
        r->capacity = 2 * (r->length + n + 1);
        r->text = realloc(r->text, r->capacity);
    }
    memcpy(r->text + r->length, s, n);
    r->length += n;
    r->text[r->length] = '\0';
}

static void append_uint(Record *r, const char *separator, unsigned long long value) {
    char buffer[32];
    if (!r->on) return;
    append(r, separator, strlen(separator));
    append(r, buffer, (size_t)snprintf(buffer, sizeof buffer, "%llu", value));
}

static void key(Record *r, const char *name) {
    append(r, ", \"", 3);
    append(r, name, strlen(name));
    append(r, "\": ", 3);
}

static Record begin(const char *call) {
    const char *path = getenv("ZYFA_FAKE_DRIVER_LOG");
    Record r = {NULL, 0, 0, path != NULL && *path != '\0'};
    append(&r, "{\"call\": \"", 10);
    append(&r, call, strlen(call));
    append(&r, "\"", 1);
    return r;
}

static void add_int(Record *r, const char *name, long long value) {
    char buffer[32];
    if (!r->on) return;
    key(r, name);
    append(r, buffer, (size_t)snprintf(buffer, sizeof buffer, "%lld", value));
}

static void add_uint(Record *r, const char *name, unsigned long long value) {
    key(r, name);
    append_uint(r, "", value);
}

static void add_string(Record *r, const char *name, const char *value) {
    key(r, name);
    append(r, "\"", 1);
    for (const char *c = value; *c != '\0'; ++c) {
        if (*c == '"' || *c == '\\') append(r, "\\", 1);
        if ((unsigned char)*c < 0x20) continue; /* test images are printable text */
        append(r, c, 1);
    }
    append(r, "\"", 1);
}

static void add_hex(Record *r, const char *name, const void *data, size_t size) {
    static const char digits[] = "0123456789abcdef";
    if (!r->on) return;
    key(r, name);
    append(r, "\"", 1);
    for (size_t i = 0; i < size; ++i) {
        char pair[2] = {digits[((const unsigned char *)data)[i] >> 4], digits[((const unsigned char *)data)[i] & 15]};
        append(r, pair, 2);
    }
    append(r, "\"", 1);
}

static void add_array64(Record *r, const char *name, const uint64_t *values, unsigned count) {
    key(r, name);
    append(r, "[", 1);
    for (unsigned i = 0; i < count; ++i) append_uint(r, i ? ", " : "", values[i]);
    append(r, "]", 1);
}

static void add_array32(Record *r, const char *name, const uint32_t *values, unsigned count) {
    key(r, name);
    append(r, "[", 1);
    for (unsigned i = 0; i < count; ++i) append_uint(r, i ? ", " : "", values[i]);
    append(r, "]", 1);
}

static int finish(Record *r, int result) {
    add_int(r, "result", result);
    append(r, "}\n", 2);
    const char *path = getenv("ZYFA_FAKE_DRIVER_LOG");
    if (r->on && path != NULL && *path != '\0') {
        pthread_mutex_lock(&log_mutex);
        FILE *log = fopen(path, "a");
        if (log != NULL) {
            fwrite(r->text, 1, r->length, log);
            fclose(log);
        }
        pthread_mutex_unlock(&log_mutex);
    }
    free(r->text);
    return result;
}

/* ---- behaviour shared by the CUDA and HIP entry points ---- */

static int load_module(Module **out, const void *image, int device) {
    if (image == NULL || strncmp((const char *)image, IMAGE_MAGIC, strlen(IMAGE_MAGIC)) != 0)
        return ERROR_INVALID_IMAGE;
    Module *module = calloc(1, sizeof *module);
    module->device = device;
    module->image = strdup((const char *)image);
    *out = module;
    return SUCCESS;
}

/* Whether `name` is one of the comma-separated names after "symbols=" in the image. */
static int has_symbol(const Module *module, const char *name) {
    const char *list = strstr(module->image, "symbols=");
    if (list == NULL) return 0;
    list += strlen("symbols=");
    size_t length = strlen(name);
    while (*list != '\0' && *list != ' ') {
        size_t token = strcspn(list, ", ");
        if (token == length && strncmp(list, name, length) == 0) return 1;
        list += token;
        if (*list == ',') ++list;
    }
    return 0;
}

static int get_function(Function **out, Module *module, const char *name) {
    if (module == NULL || name == NULL || strlen(name) >= MAX_NAME) return ERROR_INVALID_HANDLE;
    if (!has_symbol(module, name)) return ERROR_NOT_FOUND;
    Function *function = calloc(1, sizeof *function);
    function->module = module;
    strcpy(function->name, name);
    function->max_dynamic_shared = DEFAULT_SHARED_LIMIT;
    *out = function;
    return SUCCESS;
}

/* Reads the argument buffer out of a launch's `extra` list (pointer, size, end markers differ by driver). */
static int read_extra(void **extra, void *end_marker, const void **buffer, size_t *size) {
    *buffer = NULL;
    *size = 0;
    for (size_t i = 0; extra != NULL && extra[i] != end_marker; i += 2) {
        if (extra[i] == (void *)0x01) *buffer = extra[i + 1];
        else if (extra[i] == (void *)0x02) *size = *(const size_t *)extra[i + 1];
        else return ERROR_INVALID_VALUE;
    }
    return *buffer != NULL || *size == 0 ? SUCCESS : ERROR_INVALID_VALUE;
}

static int launch(Record *r, Function *function, int device, const unsigned grid[3], const unsigned block[3],
                  unsigned shared, void *stream, void **params, void **extra, void *end_marker) {
    const void *buffer;
    size_t size;
    if (function == NULL) return ERROR_INVALID_HANDLE;
    add_string(r, "function", function->name);
    add_int(r, "device", device);
    add_array32(r, "grid", grid, 3);
    add_array32(r, "block", block, 3);
    add_uint(r, "shared_bytes", shared);
    add_uint(r, "stream", (uintptr_t)stream);
    if (params != NULL) return ERROR_INVALID_VALUE; /* the loader passes arguments through `extra` only */
    int status = read_extra(extra, end_marker, &buffer, &size);
    if (status != SUCCESS) return status;
    add_hex(r, "args", buffer, size);
    add_uint(r, "args_size", size);
    if (function->module->device != device) return ERROR_INVALID_HANDLE; /* loaded for another device */
    if ((int)shared > function->max_dynamic_shared) return ERROR_INVALID_VALUE;
    return SUCCESS;
}

/* ---- CUDA driver ---- */

typedef int CUresult;

CUresult cuInit(unsigned flags) {
    Record r = begin("cuInit");
    add_uint(&r, "flags", flags);
    int failure = injected("cuInit");
    if (failure == SUCCESS) initialised = 1;
    return finish(&r, failure);
}

CUresult cuDeviceGet(int *device, int ordinal) {
    Record r = begin("cuDeviceGet");
    add_int(&r, "ordinal", ordinal);
    int failure = injected("cuDeviceGet");
    if (failure) return finish(&r, failure);
    if (ordinal < 0 || ordinal >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    *device = ordinal;
    return finish(&r, SUCCESS);
}

static int cuda_attribute(int attribute, int *value) {
    switch (attribute) {
        case CU_ATTR_MAX_THREADS_PER_BLOCK: *value = FAKE_MAX_THREADS; return SUCCESS;
        case CU_ATTR_WARP_SIZE: *value = CUDA_WARP; return SUCCESS;
        case CU_ATTR_MULTIPROCESSOR_COUNT: *value = env_int("ZYFA_FAKE_DRIVER_SMS", DEFAULT_SMS); return SUCCESS;
        case CU_ATTR_L2_CACHE_SIZE: *value = FAKE_L2_BYTES; return SUCCESS;
        case CU_ATTR_CC_MAJOR: *value = 9; return SUCCESS;
        case CU_ATTR_CC_MINOR: *value = 0; return SUCCESS;
        case CU_ATTR_MAX_SHARED_OPTIN:
            *value = env_int("ZYFA_FAKE_DRIVER_MAX_SHARED", DEFAULT_MAX_SHARED);
            return SUCCESS;
        default: return ERROR_INVALID_VALUE;
    }
}

CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
    Record r = begin("cuDeviceGetAttribute");
    add_int(&r, "attribute", attribute);
    add_int(&r, "device", device);
    int failure = injected("cuDeviceGetAttribute");
    if (failure) return finish(&r, failure);
    if (device < 0 || device >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    return finish(&r, cuda_attribute(attribute, value));
}

CUresult cuDeviceGetName(char *name, int length, int device) {
    Record r = begin("cuDeviceGetName");
    add_int(&r, "device", device);
    int failure = injected("cuDeviceGetName");
    if (failure) return finish(&r, failure);
    snprintf(name, (size_t)length, "ZYFA fake CUDA device %d", device);
    return finish(&r, SUCCESS);
}

CUresult cuDevicePrimaryCtxRetain(Context **context, int device) {
    Record r = begin("cuDevicePrimaryCtxRetain");
    add_int(&r, "device", device);
    int failure = injected("cuDevicePrimaryCtxRetain");
    if (failure) return finish(&r, failure);
    if (device < 0 || device >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    primary_contexts[device].device = device;
    *context = &primary_contexts[device];
    return finish(&r, SUCCESS);
}

CUresult cuCtxGetCurrent(Context **context) {
    Record r = begin("cuCtxGetCurrent");
    int failure = injected("cuCtxGetCurrent");
    if (failure) return finish(&r, failure);
    *context = current_context;
    add_int(&r, "device", current_context ? current_context->device : -1);
    return finish(&r, SUCCESS);
}

CUresult cuCtxSetCurrent(Context *context) {
    Record r = begin("cuCtxSetCurrent");
    add_int(&r, "device", context ? context->device : -1);
    int failure = injected("cuCtxSetCurrent");
    if (failure) return finish(&r, failure);
    current_context = context;
    return finish(&r, SUCCESS);
}

CUresult cuModuleLoadData(Module **module, const void *image) {
    Record r = begin("cuModuleLoadData");
    if (image != NULL) add_string(&r, "image", (const char *)image);
    int failure = injected("cuModuleLoadData");
    if (failure) return finish(&r, failure);
    if (current_context == NULL) return finish(&r, ERROR_INVALID_CONTEXT);
    add_int(&r, "device", current_context->device);
    return finish(&r, load_module(module, image, current_context->device));
}

CUresult cuModuleGetFunction(Function **function, Module *module, const char *name) {
    Record r = begin("cuModuleGetFunction");
    add_string(&r, "name", name ? name : "");
    int failure = injected("cuModuleGetFunction");
    if (failure) return finish(&r, failure);
    return finish(&r, get_function(function, module, name));
}

CUresult cuFuncSetAttribute(Function *function, int attribute, int value) {
    Record r = begin("cuFuncSetAttribute");
    add_int(&r, "attribute", attribute);
    add_int(&r, "value", value);
    int failure = injected("cuFuncSetAttribute");
    if (failure) return finish(&r, failure);
    if (function == NULL) return finish(&r, ERROR_INVALID_HANDLE);
    if (attribute != CU_FUNC_ATTR_MAX_DYNAMIC_SHARED) return finish(&r, ERROR_INVALID_VALUE);
    if (value < 0 || value > env_int("ZYFA_FAKE_DRIVER_MAX_SHARED", DEFAULT_MAX_SHARED))
        return finish(&r, ERROR_INVALID_VALUE);
    function->max_dynamic_shared = value;
    return finish(&r, SUCCESS);
}

/* Reads parameter `index` of the image's "params=offset:size,..." list. */
CUresult cuFuncGetParamInfo(Function *function, size_t index, size_t *offset, size_t *size) {
    Record r = begin("cuFuncGetParamInfo");
    add_uint(&r, "index", index);
    int failure = injected("cuFuncGetParamInfo");
    if (failure) return finish(&r, failure);
    if (function == NULL) return finish(&r, ERROR_INVALID_HANDLE);
    const char *list = strstr(function->module->image, "params=");
    if (list == NULL) return finish(&r, ERROR_INVALID_VALUE);
    list += strlen("params=");
    for (size_t i = 0; i < index && list != NULL; ++i) {
        list = strchr(list, ',');
        if (list != NULL) ++list;
    }
    unsigned long long o, s;
    if (list == NULL || index >= MAX_PARAMS || sscanf(list, "%llu:%llu", &o, &s) != 2)
        return finish(&r, ERROR_INVALID_VALUE);
    *offset = (size_t)o;
    *size = (size_t)s;
    return finish(&r, SUCCESS);
}

CUresult cuLaunchKernel(Function *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    Record r = begin("cuLaunchKernel");
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    int failure = injected("cuLaunchKernel");
    if (failure) return finish(&r, failure);
    if (current_context == NULL) return finish(&r, ERROR_INVALID_CONTEXT);
    return finish(&r, launch(&r, function, current_context->device, grid, block, shared, stream, params, extra,
                             (void *)0x00));
}

CUresult cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
        case SUCCESS: *name = "CUDA_SUCCESS"; return SUCCESS;
        case ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return SUCCESS;
        case ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; return SUCCESS;
        case ERROR_INVALID_IMAGE: *name = "CUDA_ERROR_INVALID_IMAGE"; return SUCCESS;
        case ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return SUCCESS;
        case ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; return SUCCESS;
        case ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; return SUCCESS;
        default: *name = NULL; return ERROR_INVALID_VALUE;
    }
}

CUresult cuTensorMapEncodeTiled(void *map, int data_type, uint32_t rank, void *address, const uint64_t *dims,
                                const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
                                int interleave, int swizzle, int l2_promotion, int oob_fill) {
    Record r = begin("cuTensorMapEncodeTiled");
    add_int(&r, "data_type", data_type);
    add_uint(&r, "rank", rank);
    add_uint(&r, "address", (uintptr_t)address);
    add_array64(&r, "dims", dims, rank);
    add_array64(&r, "strides", strides, rank - 1);
    add_array32(&r, "box", box, rank);
    add_array32(&r, "element_strides", element_strides, rank);
    add_int(&r, "interleave", interleave);
    add_int(&r, "swizzle", swizzle);
    add_int(&r, "l2_promotion", l2_promotion);
    add_int(&r, "oob_fill", oob_fill);
    add_uint(&r, "map_alignment", (uintptr_t)map % TENSOR_MAP_BYTES);
    int failure = injected("cuTensorMapEncodeTiled");
    if (failure) return finish(&r, failure);
    if (!initialised) return finish(&r, ERROR_NOT_INITIALIZED);
    for (int i = 0; i < TENSOR_MAP_BYTES; ++i) ((unsigned char *)map)[i] = (unsigned char)i; /* recognisable */
    return finish(&r, SUCCESS);
}

/* ---- HIP ---- */

typedef int hipError_t;

hipError_t hipInit(unsigned flags) {
    Record r = begin("hipInit");
    add_uint(&r, "flags", flags);
    return finish(&r, injected("hipInit"));
}

hipError_t hipGetDevice(int *device) {
    Record r = begin("hipGetDevice");
    int failure = injected("hipGetDevice");
    if (failure) return finish(&r, failure);
    *device = hip_current_device;
    add_int(&r, "device", hip_current_device);
    return finish(&r, SUCCESS);
}

hipError_t hipSetDevice(int device) {
    Record r = begin("hipSetDevice");
    add_int(&r, "device", device);
    int failure = injected("hipSetDevice");
    if (failure) return finish(&r, failure);
    if (device < 0 || device >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    hip_current_device = device;
    return finish(&r, SUCCESS);
}

static int hip_attribute(int attribute, int *value) {
    switch (attribute) {
        case HIP_ATTR_MAX_THREADS_PER_BLOCK: *value = FAKE_MAX_THREADS; return SUCCESS;
        case HIP_ATTR_WARP_SIZE: *value = HIP_WAVE; return SUCCESS;
        case HIP_ATTR_MULTIPROCESSOR_COUNT: *value = env_int("ZYFA_FAKE_DRIVER_SMS", DEFAULT_SMS); return SUCCESS;
        case HIP_ATTR_L2_CACHE_SIZE: *value = FAKE_L2_BYTES; return SUCCESS;
        case HIP_ATTR_MAX_SHARED_PER_BLOCK:
            *value = env_int("ZYFA_FAKE_DRIVER_MAX_SHARED", DEFAULT_MAX_SHARED);
            return SUCCESS;
        default: return ERROR_INVALID_VALUE;
    }
}

hipError_t hipDeviceGetAttribute(int *value, int attribute, int device) {
    Record r = begin("hipDeviceGetAttribute");
    add_int(&r, "attribute", attribute);
    add_int(&r, "device", device);
    int failure = injected("hipDeviceGetAttribute");
    if (failure) return finish(&r, failure);
    if (device < 0 || device >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    return finish(&r, hip_attribute(attribute, value));
}

hipError_t hipDeviceGetName(char *name, int length, int device) {
    Record r = begin("hipDeviceGetName");
    add_int(&r, "device", device);
    int failure = injected("hipDeviceGetName");
    if (failure) return finish(&r, failure);
    if (device < 0 || device >= device_count()) return finish(&r, ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)length, "ZYFA fake HIP device %d", device);
    return finish(&r, SUCCESS);
}

hipError_t hipModuleLoadData(Module **module, const void *image) {
    Record r = begin("hipModuleLoadData");
    if (image != NULL) add_string(&r, "image", (const char *)image);
    add_int(&r, "device", hip_current_device);
    int failure = injected("hipModuleLoadData");
    if (failure) return finish(&r, failure);
    return finish(&r, load_module(module, image, hip_current_device));
}

hipError_t hipModuleGetFunction(Function **function, Module *module, const char *name) {
    Record r = begin("hipModuleGetFunction");
    add_string(&r, "name", name ? name : "");
    int failure = injected("hipModuleGetFunction");
    if (failure) return finish(&r, failure);
    hipError_t status = get_function(function, module, name);
    if (status == SUCCESS) (*function)->max_dynamic_shared = env_int("ZYFA_FAKE_DRIVER_MAX_SHARED", DEFAULT_MAX_SHARED);
    return finish(&r, status);
}

hipError_t hipModuleLaunchKernel(Function *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared, void *stream, void **params,
                                 void **extra) {
    Record r = begin("hipModuleLaunchKernel");
    unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    int failure = injected("hipModuleLaunchKernel");
    if (failure) return finish(&r, failure);
    return finish(&r, launch(&r, function, hip_current_device, grid, block, shared, stream, params, extra,
                             (void *)0x03));
}

const char *hipGetErrorName(hipError_t error) {
    switch (error) {
        case SUCCESS: return "hipSuccess";
        case ERROR_INVALID_VALUE: return "hipErrorInvalidValue";
        case ERROR_INVALID_DEVICE: return "hipErrorInvalidDevice";
        case ERROR_INVALID_IMAGE: return "hipErrorInvalidImage";
        case ERROR_INVALID_CONTEXT: return "hipErrorInvalidContext";
        case ERROR_INVALID_HANDLE: return "hipErrorInvalidHandle";
        case ERROR_NOT_FOUND: return "hipErrorNotFound";
        default: return "hipErrorUnknown";
    }
}
