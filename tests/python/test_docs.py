"""The README's code says what the repository builds: its C++ snippet is examples/cpp/readme.cpp,
which CI compiles against the installed package."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_readme_cpp_snippet_is_the_compiled_example():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```cpp\n(.*?)```", readme, flags=re.S)
    assert len(blocks) == 1
    assert blocks[0] == open(os.path.join(ROOT, "examples", "cpp", "readme.cpp")).read()
