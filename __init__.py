"""The repository's root, when Python finds it as the package `dynamicemb`.

Bazel (WORKSPACE mode) lays out an external repository named `dynamicemb` at
<runfiles>/dynamicemb/, the package at <runfiles>/dynamicemb/dynamicemb/, and
puts the runfiles root first on sys.path; a py_binary or py_test with
legacy_create_init (Bazel's default) also makes the repository's root a
package. `import dynamicemb` then finds this directory. Bazel adds this file
to the runfiles (//:repository_root) instead of an empty one, and it puts the
real package in its place. Nothing else imports it.
"""


def _load_package():
    import importlib.util
    import os
    import sys

    package_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dynamicemb")
    spec = importlib.util.spec_from_file_location(
        __name__,
        os.path.join(package_dir, "__init__.py"),
        submodule_search_locations=[package_dir],
    )
    module = importlib.util.module_from_spec(spec)
    # The import system returns what sys.modules holds once this file has run.
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


if __name__ == "dynamicemb":
    _load_package()
