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
#include <cstring>
#include <string>
#include <utility>
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

// The hot path's launch: the argument buffer packed once (by zyfa_kernels.args), the per-call values patched into
// it at their offsets, then launched. Slot kinds: 0 a ptr (uint64), 1 an i32, 2 a 128-byte tensor map.
enum SlotKind : int { kPtr = 0, kI32 = 1, kTensorMap = 2 };

template <class Driver>
class PreparedLaunch {
public:
    PreparedLaunch(nb::object owner, Driver& driver, int device, std::uintptr_t function, const Triple& grid,
                   const Triple& block, unsigned dynamic_shared_bytes, const nb::bytes& buffer,
                   std::vector<std::pair<std::size_t, int>> slots)
        : owner_(std::move(owner)), driver_(driver), device_(device), function_(function), grid_(dim3(grid)),
          block_(dim3(block)), shared_(dynamic_shared_bytes),
          template_(buffer.c_str(), buffer.c_str() + buffer.size()), slots_(std::move(slots)) {
        for (const auto& [offset, kind] : slots_) {
            std::size_t size = kind == kTensorMap ? 128 : kind == kI32 ? 4 : 8;
            if (offset + size > template_.size()) throw nb::value_error("a slot lies past the argument buffer");
        }
    }

    // Raises TypeError / OverflowError / ValueError for a value of the wrong type or range (the caller explains it).
    void launch(std::uintptr_t stream, nb::args values) {
        if (values.size() != slots_.size()) throw nb::value_error("wrong number of per-call values");
        std::vector<std::uint8_t>& buffer = scratch();
        buffer.assign(template_.begin(), template_.end());
        for (std::size_t i = 0; i < slots_.size(); ++i) {
            const auto [offset, kind] = slots_[i];
            nb::handle value = values[i];
            if (kind == kTensorMap) {
                if (!nb::isinstance<nb::bytes>(value)) throw nb::type_error("a tensor map must be bytes");
                nb::bytes map = nb::borrow<nb::bytes>(value);
                if (map.size() != 128) throw nb::value_error("a tensor map is 128 bytes");
                std::memcpy(buffer.data() + offset, map.c_str(), 128);
            } else if (kind == kI32) {
                std::int32_t v = 0;
                if (!nb::try_cast(value, v)) throw nb::type_error("an i32 value does not convert");
                std::memcpy(buffer.data() + offset, &v, sizeof v);
            } else {
                std::uint64_t v = 0;
                if (!nb::try_cast(value, v)) throw nb::type_error("a ptr value does not convert");
                std::memcpy(buffer.data() + offset, &v, sizeof v);
            }
        }
        nb::gil_scoped_release unlocked;
        driver_.launch(device_, function_, grid_, block_, shared_, stream, buffer.data(), buffer.size());
    }

private:
    static std::vector<std::uint8_t>& scratch() {
        thread_local std::vector<std::uint8_t> buffer;  // reused: no allocation per launch
        return buffer;
    }

    nb::object owner_;  // the driver object, kept alive
    Driver& driver_;
    int device_;
    std::uintptr_t function_;
    zyfa::Dim3 grid_, block_;
    unsigned shared_;
    std::vector<std::uint8_t> template_;
    std::vector<std::pair<std::size_t, int>> slots_;
};

template <class Driver>
void bind_prepared(nb::module_& m, const char* name) {
    nb::class_<PreparedLaunch<Driver>>(m, name)
        .def("__call__", &PreparedLaunch<Driver>::launch);
}

template <class Driver>
PreparedLaunch<Driver>* prepare(nb::handle self, int device, std::uintptr_t function, const Triple& grid,
                                const Triple& block, unsigned dynamic_shared_bytes, const nb::bytes& buffer,
                                std::vector<std::pair<std::size_t, int>> slots) {
    return new PreparedLaunch<Driver>(nb::borrow(self), nb::cast<Driver&>(self), device, function, grid, block,
                                      dynamic_shared_bytes, buffer, std::move(slots));
}

}  // namespace

NB_MODULE(_loader, m) {
    m.doc() = "Driver-level loader for ZYFA's prebuilt code objects (libcuda / libamdhip64 opened at run time)";
    nb::register_exception_translator(translate_driver_failures);

    bind_prepared<zyfa::CudaDriver>(m, "CudaPreparedLaunch");
    bind_prepared<zyfa::HipDriver>(m, "HipPreparedLaunch");

    nb::class_<zyfa::CudaDriver>(m, "CudaDriver")
        .def(nb::init<>(), nb::call_guard<nb::gil_scoped_release>())
        .def("prepare", &prepare<zyfa::CudaDriver>, nb::arg("device"), nb::arg("function"), nb::arg("grid"),
             nb::arg("block"), nb::arg("dynamic_shared_bytes"), nb::arg("buffer"), nb::arg("slots"))
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
        .def("prepare", &prepare<zyfa::HipDriver>, nb::arg("device"), nb::arg("function"), nb::arg("grid"),
             nb::arg("block"), nb::arg("dynamic_shared_bytes"), nb::arg("buffer"), nb::arg("slots"))
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
