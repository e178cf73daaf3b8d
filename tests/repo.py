"""Where things are, for tests in any folder under tests/."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SCRIPTS = os.path.join(ROOT, 'scripts')
FIXTURES = os.path.join(TESTS, 'fixtures')
