/* A library that is only found through its caller's RUNPATH (see runpath_program.c). */
int runpath_lib_answer(void) { return 42; }
