# Fails if any C++ source of the project differs from clang-format's output (.clang-format).
file(GLOB_RECURSE files
  ${ROOT}/src/*.h ${ROOT}/src/*.cpp ${ROOT}/src/*.cu ${ROOT}/src/*.cuh
  ${ROOT}/tools/*.h ${ROOT}/tools/*.cpp
  ${ROOT}/tests/*.h ${ROOT}/tests/*.cpp
  ${ROOT}/bench/*.h ${ROOT}/bench/*.cpp)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${files} RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "clang-format finds unformatted files (run scripts/format.sh):\n${err}")
endif()
list(LENGTH files n)
message(STATUS "clang-format: ${n} files formatted")
