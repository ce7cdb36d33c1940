// openmla::Status: the error type of every public entry point.
// A failed call names the argument, the expected and the received value in message().
#pragma once

#include <string>
#include <utility>

namespace openmla {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a caller's argument is wrong (dtype, shape, stride, value)
  kNotImplemented,   // valid request, but no kernel for it on this device yet
  kUnsupportedDevice,  // the tensors live on a device/arch this build cannot serve
  kCudaError,        // a CUDA runtime call failed
  kInternal,         // a bug in OpenMLA
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status NotImplemented(std::string m) { return {StatusCode::kNotImplemented, std::move(m)}; }
  static Status UnsupportedDevice(std::string m) {
    return {StatusCode::kUnsupportedDevice, std::move(m)};
  }
  static Status CudaError(std::string m) { return {StatusCode::kCudaError, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

const char* status_code_name(StatusCode code);

}  // namespace openmla

// Returns early from the enclosing function when `expr` is not ok.
#define OPENMLA_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::openmla::Status _openmla_st = (expr);    \
    if (!_openmla_st.ok()) return _openmla_st; \
  } while (0)
