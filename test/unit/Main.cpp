// The Catch2 main of soap-unit-tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
