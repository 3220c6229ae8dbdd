"""ThinkingBox data as a task source: a `thinkingbox-data` checkout read into tbhpc Tasks
(`dataset`), its test-case files read and their checks recognised without ever running them
(`testfile`, `checks`)."""
