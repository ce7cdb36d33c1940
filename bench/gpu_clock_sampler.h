// The SM clock and the power-cap state while a benchmark runs, sampled from NVML on a host thread.
// Compute-bound kernels can hit the GPU's power cap, which lowers the clock for a while; a timing
// is only comparable to another with its clock next to it. NVML comes with the driver, not the
// toolkit (no nvml.h here), so the few C entry points used are declared below and loaded with
// dlopen; without the library every reading is reported as unavailable.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace openmla::bench {

class GpuClockSampler {
 public:
  struct Summary {
    bool available = false;
    int samples = 0;
    unsigned median_mhz = 0, min_mhz = 0;
    double power_capped = 0.0;  // share of samples with the software power cap active
    double max_watts = 0.0;
    // "1755 MHz (min 1605), capped 40%, 690 W" or "n/a".
    std::string text() const {
      if (!available || samples == 0) return "n/a";
      char buf[96];
      std::snprintf(buf, sizeof buf, "%u MHz (min %u), capped %.0f%%, %.0f W", median_mhz, min_mhz,
                    100.0 * power_capped, max_watts);
      return buf;
    }
  };

  // NVML device index `index` (index 0 is CUDA device 0 on a one-GPU machine).
  explicit GpuClockSampler(unsigned index = 0) {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    init_ = reinterpret_cast<Init>(dlsym(lib_, "nvmlInit_v2"));
    handle_by_index_ = reinterpret_cast<HandleByIndex>(dlsym(lib_, "nvmlDeviceGetHandleByIndex_v2"));
    clock_info_ = reinterpret_cast<ClockInfo>(dlsym(lib_, "nvmlDeviceGetClockInfo"));
    reasons_ = reinterpret_cast<Reasons>(dlsym(lib_, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    power_ = reinterpret_cast<Power>(dlsym(lib_, "nvmlDeviceGetPowerUsage"));
    ok_ = init_ && handle_by_index_ && clock_info_ && reasons_ && power_ && init_() == 0 &&
          handle_by_index_(index, &device_) == 0;
  }
  ~GpuClockSampler() {
    stop();
    if (lib_ != nullptr) dlclose(lib_);  // nvmlShutdown is optional; the process ends soon after
  }
  GpuClockSampler(const GpuClockSampler&) = delete;
  GpuClockSampler& operator=(const GpuClockSampler&) = delete;

  // Samples every `period_us` until stop().
  void start(int period_us = 500) {
    stop();
    samples_.clear();
    if (!ok_) return;
    running_ = true;
    thread_ = std::thread([this, period_us] {
      while (running_.load(std::memory_order_relaxed)) {
        Sample s;
        unsigned long long reasons = 0;
        unsigned mw = 0;
        if (clock_info_(device_, kClockSm, &s.mhz) == 0 && reasons_(device_, &reasons) == 0 &&
            power_(device_, &mw) == 0) {
          s.capped = (reasons & kReasonSwPowerCap) != 0;
          s.watts = mw * 1e-3;
          samples_.push_back(s);
        }
        std::this_thread::sleep_for(std::chrono::microseconds(period_us));
      }
    });
  }

  Summary stop() {
    if (thread_.joinable()) {
      running_ = false;
      thread_.join();
    }
    Summary sum;
    sum.available = ok_;
    sum.samples = static_cast<int>(samples_.size());
    if (samples_.empty()) return sum;
    std::vector<unsigned> mhz;
    int capped = 0;
    for (const Sample& s : samples_) {
      mhz.push_back(s.mhz);
      capped += s.capped;
      sum.max_watts = std::max(sum.max_watts, s.watts);
    }
    std::sort(mhz.begin(), mhz.end());
    sum.median_mhz = mhz[mhz.size() / 2];
    sum.min_mhz = mhz.front();
    sum.power_capped = static_cast<double>(capped) / samples_.size();
    return sum;
  }

 private:
  // NVML's C ABI (nvml.h): return 0 is NVML_SUCCESS; nvmlDevice_t is an opaque pointer.
  using Device = void*;
  using Init = int (*)();
  using HandleByIndex = int (*)(unsigned, Device*);
  using ClockInfo = int (*)(Device, int, unsigned*);
  using Reasons = int (*)(Device, unsigned long long*);
  using Power = int (*)(Device, unsigned*);
  static constexpr int kClockSm = 1;                              // NVML_CLOCK_SM
  static constexpr unsigned long long kReasonSwPowerCap = 0x4ull;  // nvmlClocksEventReasonSwPowerCap

  struct Sample {
    unsigned mhz = 0;
    bool capped = false;
    double watts = 0.0;
  };

  void* lib_ = nullptr;
  Init init_ = nullptr;
  HandleByIndex handle_by_index_ = nullptr;
  ClockInfo clock_info_ = nullptr;
  Reasons reasons_ = nullptr;
  Power power_ = nullptr;
  Device device_ = nullptr;
  bool ok_ = false;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::vector<Sample> samples_;  // written by the thread only while it runs
};

}  // namespace openmla::bench
