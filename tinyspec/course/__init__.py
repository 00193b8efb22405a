"""The course: the chapters a student writes, their functions, tests, hours and deliverables
(`assignments.py`), and handing them out as stubs and grading them with the tests
(`handouts.py`, `python -m tinyspec course`)."""
