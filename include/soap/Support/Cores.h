// The cores this process may run on.
#ifndef SOAP_SUPPORT_CORES_H
#define SOAP_SUPPORT_CORES_H

namespace soap {

/// The CPUs in this process's affinity mask (taskset, cgroups' cpusets),
/// else the hardware's thread count; at least 1.
int availableCores();

} // namespace soap

#endif // SOAP_SUPPORT_CORES_H
