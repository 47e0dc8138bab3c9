# The link launcher (RULE_LAUNCH_LINK) of the target modelyard_prelinked: CMake hands it the link
# command of a shared library (after --); instead of running it, this partially links (ld -r)
# the same objects and static libraries into the output, a relocatable object, and makes every
# symbol but modelyard_* local. The archive list is the one CMake computed for the link, IREE's
# generator expressions resolved; ld -r takes from it only the members the objects need.
#   cmake -DLD=ld -DOBJCOPY=objcopy -P prelink.cmake -- <compiler> <flags...> -o <out> <inputs...>
set(objects "")
set(archives "")
set(out "")
set(seen_dashes OFF)
set(next_is_out OFF)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 0 ${last})
  set(arg "${CMAKE_ARGV${i}}")
  if(NOT seen_dashes)
    if(arg STREQUAL "--")
      set(seen_dashes ON)
    endif()
  elseif(next_is_out)
    set(out "${arg}")
    set(next_is_out OFF)
  elseif(arg STREQUAL "-o")
    set(next_is_out ON)
  elseif(arg MATCHES "^-")
    # a flag (-shared, -Wl,-soname,..., -ldl): a partial link takes none
  elseif(arg MATCHES "\\.o$")
    list(APPEND objects "${arg}")
  elseif(arg MATCHES "\\.a$")
    list(APPEND archives "${arg}")
  endif()
endforeach()
if(NOT out OR NOT objects)
  message(FATAL_ERROR "prelink.cmake: no -o or no objects in the link command")
endif()
execute_process(COMMAND "${LD}" -r -o "${out}" ${objects} --start-group ${archives} --end-group
                COMMAND_ERROR_IS_FATAL ANY)
# .comment names the compiler (lintian: static-library-has-unneeded-sections); .note.GNU-stack stays
execute_process(COMMAND "${OBJCOPY}" --wildcard "--keep-global-symbol=modelyard_*" --strip-unneeded
                        --remove-section=.comment "${out}"
                COMMAND_ERROR_IS_FATAL ANY)
