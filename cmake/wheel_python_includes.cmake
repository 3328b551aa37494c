# The PyPI ros-* wheels export their *__rosidl_generator_py targets with the
# include directories of the machine that built them (/opt/python/...), which
# do not exist here. Replace them with this interpreter's Python and NumPy
# headers so the generated C extension compiles against what is installed.
# Call after rosidl_generate_interfaces with the message packages depended on.
function(fix_wheel_python_includes)
  find_package(Python3 REQUIRED COMPONENTS Interpreter Development NumPy)
  get_property(_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_dep ${ARGN})
    list(APPEND _imported ${_dep}::${_dep}__rosidl_generator_py)
  endforeach()
  list(REMOVE_DUPLICATES _imported)
  foreach(_target IN LISTS _imported)
    if(TARGET ${_target})
      get_target_property(_real ${_target} ALIASED_TARGET)
      if(_real)
        continue()
      endif()
      get_target_property(_dirs ${_target} INTERFACE_INCLUDE_DIRECTORIES)
      if(_dirs)
        list(FILTER _dirs EXCLUDE REGEX "^/opt/python")
        list(APPEND _dirs ${Python3_INCLUDE_DIRS} ${Python3_NumPy_INCLUDE_DIRS})
        set_target_properties(${_target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_dirs}")
      endif()
    endif()
  endforeach()
endfunction()
