"""The test environment tensorflow/estimator 2.15.0's tests were written for, on the Pythons
after it: tools/run_suite.py puts this file on the path of every test process as its
``sitecustomize`` (which Python's ``site`` imports at start), on every release alike (TensorFlow
2.15 as shipped too), so that a count that differs between two releases is TensorFlow's or the
layer's, never Python's.

It gives back two things the tests call and Python has since removed; nothing of TensorFlow's
or the estimator's is touched:

- ``inspect.getargspec``, removed in Python 3.11 (docs.python.org/3/whatsnew/3.11.html,
  "Removed"); canned_canned_estimator_ds_integration_test.py reads a constructor's arguments
  with it.
- unittest.TestCase's old assertion names (``assertEquals`` and the like), removed in Python 3.12
  (docs.python.org/3/whatsnew/3.12.html, "unittest"); thirty-odd files call ``assertEquals``.
"""

import collections
import inspect
import unittest

if not hasattr(inspect, "getargspec"):
    ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")

    def _getargspec(func):
        spec = inspect.getfullargspec(func)
        if spec.kwonlyargs or spec.annotations:
            # As Python 3.10's did: the old shape has no place for these.
            raise ValueError("Function has keyword-only parameters or annotations, use "
                             "inspect.signature() API which can support them")
        return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)

    inspect.getargspec = _getargspec

# Each removed name and the one it stood for (Python 3.11's unittest/case.py).
_REMOVED_ASSERTIONS = {
    "failUnlessEqual": "assertEqual", "assertEquals": "assertEqual",
    "failIfEqual": "assertNotEqual", "assertNotEquals": "assertNotEqual",
    "failUnlessAlmostEqual": "assertAlmostEqual", "assertAlmostEquals": "assertAlmostEqual",
    "failIfAlmostEqual": "assertNotAlmostEqual", "assertNotAlmostEquals": "assertNotAlmostEqual",
    "failUnless": "assertTrue", "assert_": "assertTrue", "failIf": "assertFalse",
    "failUnlessRaises": "assertRaises", "assertRaisesRegexp": "assertRaisesRegex",
    "assertRegexpMatches": "assertRegex", "assertNotRegexpMatches": "assertNotRegex",
}
for _old, _new in _REMOVED_ASSERTIONS.items():
    if not hasattr(unittest.TestCase, _old):
        setattr(unittest.TestCase, _old, getattr(unittest.TestCase, _new))
