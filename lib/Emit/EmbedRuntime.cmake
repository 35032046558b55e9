# Writes the DTensor programs' runtime (dtensor_runtime.py) as a C++ raw
# string, so that soapc carries it and an emitted program needs no sources.
#   cmake -DIN=dtensor_runtime.py -DOUT=DTensorRuntime.inc -P EmbedRuntime.cmake
file(READ "${IN}" text)
string(FIND "${text}" ")SOAPRT" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw string's delimiter )SOAPRT")
endif()
file(WRITE "${OUT}.tmp"
  "// Generated from lib/Emit/dtensor_runtime.py by EmbedRuntime.cmake.\n"
  "static const char kDTensorRuntime[] = R\"SOAPRT(${text})SOAPRT\";\n")
file(RENAME "${OUT}.tmp" "${OUT}")
