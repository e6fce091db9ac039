"""Structural evidence in a failed instance's output, beyond single-line
patterns: the Python traceback (exception type, where it was raised), the
signal that ended the process in any of its spellings, several ranks'
output in one tail, and the launcher's own summary. Pure: text in, data out.
"""
