# Configure examples/c against an installed prefix with find_package, build, run; then build
# demo.c once more with only pkg-config's flags. Invoked by CTest (examples_find_package).
foreach(var PREFIX SOURCE BINARY)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_examples.cmake needs -D${var}=...")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${BINARY})
run(${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${BINARY})
run(${BINARY}/demo_c)
run(${BINARY}/demo_cpp)
run(${BINARY}/demo_static)

find_program(PKG_CONFIG NAMES pkg-config pkgconf REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${PREFIX}/lib/pkgconfig)
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs mxnet OUTPUT_VARIABLE flags
                RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config does not find mxnet in ${PREFIX}/lib/pkgconfig")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(cc -std=c99 ${SOURCE}/demo.c ${flags} -Wl,-rpath,${PREFIX}/lib -o ${BINARY}/demo_pkgconfig)
run(${BINARY}/demo_pkgconfig)
message("pkg-config: ok")
