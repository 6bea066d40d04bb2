# check_temp_dir.cmake — the C++ tests' temporary folder (TMPDIR of every CTest test,
# tests/CMakeLists.txt): `-DMODE=setup` empties it before the tests, `-DMODE=check`
# after them fails naming what a test left behind (then removes it, so that the next
# run starts clean). Issue 38, item 17: six /tmp/ferry-test-* (a FIFO, a read-only
# file in its folder) stayed after each scripts/test.
#   cmake -DDIR=<folder> -DMODE=setup|check -P check_temp_dir.cmake
if(NOT DIR OR NOT MODE)
  message(FATAL_ERROR "usage: cmake -DDIR=<folder> -DMODE=setup|check -P check_temp_dir.cmake")
endif()

function(remove_all_in folder)  # folders made writable first: read-only ones too
  file(GLOB entries LIST_DIRECTORIES true "${folder}/*" "${folder}/.*")
  foreach(entry IN LISTS entries)
    if(IS_DIRECTORY "${entry}" AND NOT IS_SYMLINK "${entry}")
      file(CHMOD_RECURSE "${entry}" DIRECTORY_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
    endif()
  endforeach()
  if(entries)
    file(REMOVE_RECURSE ${entries})
  endif()
endfunction()

if(MODE STREQUAL "setup")
  file(MAKE_DIRECTORY "${DIR}")
  remove_all_in("${DIR}")
elseif(MODE STREQUAL "check")
  file(GLOB_RECURSE left LIST_DIRECTORIES true RELATIVE "${DIR}" "${DIR}/*")
  if(left)
    list(SORT left)
    list(JOIN left "\n  " listing)
    remove_all_in("${DIR}")
    message(FATAL_ERROR "the tests left these in their temporary folder ${DIR} (removed now; a "
                        "ferry-test-Suite.Name-* folder names its test):\n  ${listing}")
  endif()
  message(STATUS "the tests left nothing in ${DIR}")
else()
  message(FATAL_ERROR "MODE must be setup or check, not ${MODE}")
endif()
