#pragma once
// Shared libraries loaded at first use (OpenBLAS, cuBLAS): from the path in an environment
// variable when it is set, else from the path found at build time, else by the library's name
// through the loader's search path (LD_LIBRARY_PATH, ld.so.cache), so that a build moved to
// another machine (tests/gpu/pack.sh) finds the library where that machine keeps it.

#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace troupe::kernels::detail {

/// dlopen (RTLD_NOW | RTLD_LOCAL) of the first that loads of: $env_var, `built`, each of `names`.
/// A set variable that does not load is an error (no quiet fallback past an explicit choice).
/// The error names every place tried with the loader's reason, then `hint`.
inline void* open_library(const char* what, const char* env_var, const char* built,
                          std::initializer_list<const char*> names, const std::string& hint) {
  std::string tried;
  auto attempt = [&](const char* path) -> void* {
    if (path == nullptr || *path == '\0') return nullptr;
    if (void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    tried += std::string("\n  ") + path + ": " + (why != nullptr ? why : "not loaded");
    return nullptr;
  };
  if (const char* chosen = std::getenv(env_var); chosen != nullptr && *chosen != '\0') {
    if (void* handle = attempt(chosen)) return handle;
    throw std::runtime_error(std::string("cannot load ") + what + " from " + env_var + "=" + chosen + ":" + tried);
  }
  if (void* handle = attempt(built)) return handle;
  for (const char* name : names)
    if (void* handle = attempt(name)) return handle;
  throw std::runtime_error(std::string("cannot load ") + what + "; tried:" + tried + "\n" + hint);
}

}  // namespace troupe::kernels::detail
