// zyfa_kernels._loader: the driver calls behind zyfa_kernels.launch, device_info and encode_tensor_map.
// Every driver call runs without the GIL; driver failures surface as zyfa_kernels.errors exceptions.
#include <nanobind/nanobind.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_driver.h"
#include "hip_driver.h"

namespace nb = nanobind;

namespace {

using Triple = std::array<unsigned, 3>;

zyfa::Dim3 dim3(const Triple& t) { return {t[0], t[1], t[2]}; }

nb::dict to_dict(const zyfa::DeviceInfo& info) {
    nb::dict out;
    out["name"] = info.name;
    for (const auto& [key, value] : info.attributes) out[key.c_str()] = value;
    return out;
}

// C++ driver failures become the Python exception types that zyfa_kernels exports.
void translate_driver_failures(const std::exception_ptr& failure, void*) {
    try {
        std::rethrow_exception(failure);
    } catch (const zyfa::DriverCallFailed& e) {
        nb::object type = nb::module_::import_("zyfa_kernels.errors").attr("DriverError");
        nb::object error = type(e.call, e.code, e.name);
        PyErr_SetObject(type.ptr(), error.ptr());
    } catch (const zyfa::DriverMissing& e) {
        nb::object type = nb::module_::import_("zyfa_kernels.errors").attr("DriverUnavailable");
        PyErr_SetString(type.ptr(), e.what());
    }
}

template <class Driver>
nb::dict device_info(Driver& driver, int device) {
    zyfa::DeviceInfo info;
    {
        nb::gil_scoped_release unlocked;
        info = driver.device_info(device);
    }
    return to_dict(info);
}

template <class Driver>
void launch(Driver& driver, int device, std::uintptr_t function, const Triple& grid, const Triple& block,
            unsigned dynamic_shared_bytes, std::uintptr_t stream, const nb::bytes& args) {
    const void* data = args.c_str();
    std::size_t size = args.size();
    nb::gil_scoped_release unlocked;
    driver.launch(device, function, dim3(grid), dim3(block), dynamic_shared_bytes, stream, data, size);
}

}  // namespace

NB_MODULE(_loader, m) {
    m.doc() = "Driver-level loader for ZYFA's prebuilt code objects (libcuda / libamdhip64 opened at run time)";
    nb::register_exception_translator(translate_driver_failures);

    nb::class_<zyfa::CudaDriver>(m, "CudaDriver")
        .def(nb::init<>(), nb::call_guard<nb::gil_scoped_release>())
        .def("device_info", &device_info<zyfa::CudaDriver>, nb::arg("device"))
        .def(
            "load",
            [](zyfa::CudaDriver& self, int device, const nb::bytes& image, const std::string& symbol,
               unsigned dynamic_shared_bytes) {
                const void* data = image.c_str();
                nb::gil_scoped_release unlocked;
                return self.load(device, data, symbol, dynamic_shared_bytes);
            },
            nb::arg("device"), nb::arg("image"), nb::arg("symbol"), nb::arg("dynamic_shared_bytes"))
        .def("launch", &launch<zyfa::CudaDriver>, nb::arg("device"), nb::arg("function"), nb::arg("grid"),
             nb::arg("block"), nb::arg("dynamic_shared_bytes"), nb::arg("stream"), nb::arg("args"))
        .def(
            "param_layout",
            [](zyfa::CudaDriver& self, int device, std::uintptr_t function) {
                nb::gil_scoped_release unlocked;
                return self.param_layout(device, function);
            },
            nb::arg("device"), nb::arg("function"))
        .def(
            "encode_tensor_map",
            [](zyfa::CudaDriver& self, int data_type, std::uintptr_t address, std::vector<std::uint64_t> dims,
               std::vector<std::uint64_t> strides_bytes, std::vector<std::uint32_t> box_dims,
               std::vector<std::uint32_t> element_strides, int interleave, int swizzle, int l2_promotion,
               int oob_fill) {
                zyfa::TensorMapRequest request{data_type,
                                               reinterpret_cast<void*>(address),
                                               std::move(dims),
                                               std::move(strides_bytes),
                                               std::move(box_dims),
                                               std::move(element_strides),
                                               interleave,
                                               swizzle,
                                               l2_promotion,
                                               oob_fill};
                std::array<std::uint8_t, zyfa::CudaDriver::kTensorMapBytes> map;
                {
                    nb::gil_scoped_release unlocked;
                    map = self.encode_tensor_map(request);
                }
                return nb::bytes(reinterpret_cast<const char*>(map.data()), map.size());
            },
            nb::arg("data_type"), nb::arg("address"), nb::arg("dims"), nb::arg("strides_bytes"),
            nb::arg("box_dims"), nb::arg("element_strides"), nb::arg("interleave"), nb::arg("swizzle"),
            nb::arg("l2_promotion"), nb::arg("oob_fill"));

    nb::class_<zyfa::HipDriver>(m, "HipDriver")
        .def(nb::init<>(), nb::call_guard<nb::gil_scoped_release>())
        .def("device_info", &device_info<zyfa::HipDriver>, nb::arg("device"))
        .def(
            "load",
            [](zyfa::HipDriver& self, int device, const nb::bytes& image, const std::string& symbol) {
                const void* data = image.c_str();
                nb::gil_scoped_release unlocked;
                return self.load(device, data, symbol);
            },
            nb::arg("device"), nb::arg("image"), nb::arg("symbol"))
        .def("launch", &launch<zyfa::HipDriver>, nb::arg("device"), nb::arg("function"), nb::arg("grid"),
             nb::arg("block"), nb::arg("dynamic_shared_bytes"), nb::arg("stream"), nb::arg("args"));
}
