# Helpers shared by every project target: warnings as errors apply to our code only.

function(kvtier_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Werror -Wno-missing-field-initializers>)
endfunction()

# kvtier_module(NAME SOURCES ... DEPS ...): one static library per module under src/.
function(kvtier_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kvtier_${name} STATIC ${ARG_SOURCES})
  add_library(kvtier::${name} ALIAS kvtier_${name})
  target_include_directories(kvtier_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(kvtier_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  kvtier_warnings(kvtier_${name})
endfunction()
