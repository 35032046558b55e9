// Command-line set-up shared by the tools (soapc, soap-run, soap-profile).
#ifndef SOAP_SUPPORT_TOOLOPTIONS_H
#define SOAP_SUPPORT_TOOLOPTIONS_H

namespace soap {

/// Removes the "threads" option that libLLVM registers for itself (unrelated
/// to the tools and undocumented), so that a tool can define its own
/// --threads. Call before the tool's option is created.
void removeLlvmThreadsOption();

} // namespace soap

#endif // SOAP_SUPPORT_TOOLOPTIONS_H
