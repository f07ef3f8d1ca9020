// The same checks as header_check.c, compiled as C++11 (see CMakeLists.txt).
#include "header_check.c"
