// A GPU driver library opened at run time, and the two failures every driver call can end in.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace zyfa {

// A driver entry point returned an error: the call's name, its numeric code and the driver's name for it.
struct DriverCallFailed : std::runtime_error {
    DriverCallFailed(std::string call, long long code, std::string name);
    std::string call;
    long long code;
    std::string name;
};

// The driver library (or one of its entry points) is not there: no GPU driver on this machine.
struct DriverMissing : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Launch geometry in the drivers' order: x, y, z.
struct Dim3 {
    unsigned x, y, z;
};

// The environment variable `env` names the library, else `default_path` is used. The library stays loaded for
// the life of the process: code objects loaded through it must outlive every launch.
class DriverLibrary {
public:
    DriverLibrary(const char* env, const char* default_path, const char* driver_name);
    DriverLibrary(const DriverLibrary&) = delete;
    DriverLibrary& operator=(const DriverLibrary&) = delete;

    const std::string& path() const { return path_; }

    template <class Fn>
    void bind(Fn& fn, const char* symbol) const {
        fn = reinterpret_cast<Fn>(lookup(symbol));
    }

    // Binds `fn` to the entry point if the library has it, else sets it to null.
    template <class Fn>
    void bind_optional(Fn& fn, const char* symbol) const {
        fn = reinterpret_cast<Fn>(find(symbol));
    }

private:
    void* find(const char* symbol) const;
    void* lookup(const char* symbol) const;

    void* handle_ = nullptr;
    std::string path_;
    std::string driver_name_;
};

}  // namespace zyfa
