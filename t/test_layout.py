"""The layout of src/ that doc/architecture.md draws (issue 44), kept by a
test rather than by review: subsystem folders, top to bottom; one public
header each (and a <folder>_int.h that no other folder includes); every .c
includes postgres.h first, then only its own folder's header and the public
headers of the folders below it; a public header includes base.h alone and a
folder's _int.h its own public header, so no include chain is longer than
two; and no .c is over 1000 lines.  Nothing here starts a server."""
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
# top to bottom: a folder may include the public headers of those after it
LAYERS = ["interface", "lock", "wait", "worker", "redis", "net", "base"]
OURS = re.compile(r'^#include "((%s)/[\w]+\.h)"' % "|".join(LAYERS), re.M)
MAX_LINES = 1000


def rel(path):
    return os.path.relpath(path, ROOT)


def includes(path):
    return OURS.findall(open(path).read())


def test_the_folders_are_the_layers():
    assert sorted(os.listdir(SRC)) == sorted(LAYERS)
    assert not glob.glob(os.path.join(SRC, "*.[ch]"))


def test_one_public_header_per_folder_and_at_most_one_internal():
    for folder in LAYERS:
        headers = sorted(os.path.basename(h) for h in glob.glob(os.path.join(SRC, folder, "*.h")))
        assert folder + ".h" in headers, folder
        assert set(headers) <= {folder + ".h", folder + "_int.h"}, (folder, headers)


def test_every_c_file_includes_postgres_h_first():
    for path in glob.glob(os.path.join(SRC, "*", "*.c")):
        first = re.search(r'^#include [<"]([^">]+)[">]', open(path).read(), re.M)
        assert first and first.group(1) == "postgres.h", rel(path)


def test_c_files_include_their_own_folder_and_folders_below_only():
    for path in glob.glob(os.path.join(SRC, "*", "*.c")):
        folder = os.path.basename(os.path.dirname(path))
        below = LAYERS[LAYERS.index(folder) + 1:]
        for header, hfolder in includes(path):
            if hfolder == folder:
                continue
            assert hfolder in below, "%s includes %s, above it or beside it" % (rel(path), header)
            assert header == "%s/%s.h" % (hfolder, hfolder), \
                "%s includes %s, another folder's internal header" % (rel(path), header)


def test_headers_chain_at_most_two_deep():
    for folder in LAYERS:
        public = os.path.join(SRC, folder, folder + ".h")
        got = [h for h, _ in includes(public)]
        assert got == ([] if folder == "base" else ["base/base.h"]), (rel(public), got)
        internal = os.path.join(SRC, folder, folder + "_int.h")
        if os.path.exists(internal):
            assert [h for h, _ in includes(internal)] == ["%s/%s.h" % (folder, folder)], rel(internal)


def test_no_c_file_over_1000_lines():
    long = {rel(p): n for p in glob.glob(os.path.join(SRC, "*", "*.c"))
            for n in [sum(1 for _ in open(p))] if n > MAX_LINES}
    assert long == {}, long


def test_the_makefile_names_every_object():
    objs = set(re.findall(r"(src/\w+/\w+)\.o", open(os.path.join(ROOT, "Makefile")).read()))
    sources = {rel(p)[:-2] for p in glob.glob(os.path.join(SRC, "*", "*.c"))}
    assert objs == sources
