// The Device contract (device_contract.h) on the CPU device.
#include "device/cpu_device.h"
#include "device_contract.h"

hvdtorch::Device& hvdtorch::contract::contractDevice() { return cpuDevice(); }

HVD_TEST_MAIN()
