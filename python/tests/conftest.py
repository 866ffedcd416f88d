import os
import sys

# The fakes live beside the tests; the package under test is the installed wheel.
sys.path.insert(0, os.path.dirname(__file__))
