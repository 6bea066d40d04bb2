# scripts/check-function-length's scanner fed tricky C++ (braces in strings,
# comments, raw strings and char literals, lambdas, initializer lists, default
# arguments, NB_MODULE, a .cu kernel) in a temporary folder, and its exit
# status and allow-list. Each length here is what lizard reports for the same text.
import importlib.machinery
import importlib.util
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "check-function-length"


def _load():
    loader = importlib.machinery.SourceFileLoader("check_function_length", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


cfl = _load()


def lengths(text, name="x.cpp"):
    return {(f.name, f.line): f.length for f in cfl.functions(name, text)}


def body(lines):
    return "".join(f"  x += {i};\n" for i in range(lines))


def test_length_runs_from_the_name_line_to_the_closing_brace():
    text = "int f(int a,\n      int b)\n{\n" + body(5) + "}\n"
    assert lengths(text) == {("f", 1): 9}


def test_braces_in_strings_comments_raw_strings_and_chars_do_not_count():
    text = (
        'void f() {\n'
        '  const char* s = "}{ \\" }";  // } {\n'
        '  /* }\n'
        '     } */\n'
        '  auto r = R"x( } " )" }} )x";\n'
        "  char c = '}'; char d = '\\'';\n"
        "  long n = 1'000'000; // a digit separator is not a char literal\n"
        "}\n"
        "void g() {}\n"
    )
    assert lengths(text) == {("f", 1): 8, ("g", 9): 1}


def test_lambdas_count_toward_their_function():
    text = "void f() {\n  auto g = [&](int a) {\n" + body(3) + "  };\n  g(1);\n}\n"
    assert lengths(text) == {("f", 1): 8}


def test_nb_module_is_a_function():
    text = "#include <x>\nNB_MODULE(_ferry, m) {\n" + body(81) + "}\n"
    assert lengths(text) == {("NB_MODULE", 2): 83}


def test_classes_namespaces_init_lists_and_default_arguments():
    text = (
        "namespace a::b {\n"
        "class C : public ::base::D<int> {\n"
        " public:\n"
        "  explicit C(int x, Opts o = {}) : x_{x}, y_(x), z_{std::vector<int>{1, 2}} {\n"
        "    x_ += 1;\n"
        "  }\n"
        "  int get() const noexcept { return x_; }\n"
        "  int x_{0};\n"
        "  enum class E { one, two };\n"
        "};\n"
        "auto C::make() -> std::unique_ptr<C> {\n"
        "  return {};\n"
        "}\n"
        "bool operator==(const C& l, const C& r) { return l.x_ == r.x_; }\n"
        "const int table[] = {1, 2, 3};\n"
        'extern "C" {\n'
        "int c_call(void) { return 0; }\n"
        "}\n"
        "}  // namespace a::b\n"
    )
    assert lengths(text) == {
        ("C", 4): 3,
        ("get", 7): 1,
        ("C::make", 11): 3,
        ("operator==", 14): 1,
        ("c_call", 17): 1,
    }


def test_directives_are_skipped_and_both_branches_measured():
    text = (
        "#define OPEN(x) { \\\n  x\n"
        "#if X\nvoid f() {\n" + body(2) + "}\n#else\nvoid f() {}\n#endif\n"
    )
    assert lengths(text) == {("f", 4): 4, ("f", 9): 1}


def test_exit_status_and_allow_list(tmp_path):
    (tmp_path / "k.cu").write_text(
        "__global__ void __launch_bounds__(256) kernel(int* p) {\n" + body(80) + "}\n"
    )
    (tmp_path / "ok.h").write_text("inline int f() {\n" + body(78) + "}\n")  # 80 lines: passes
    allow = tmp_path / "allow"
    allow.write_text("")

    def run():
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--allow", str(allow), str(tmp_path)],
            capture_output=True, text=True,
        )

    r = run()
    assert r.returncode == 1
    assert f"{tmp_path / 'k.cu'}:1: kernel has 82 lines (limit 80)" in r.stderr
    assert "ok.h" not in r.stderr

    allow.write_text(f"# why it may pass\n{tmp_path / 'k.cu'} kernel\n")
    r = run()
    assert r.returncode == 0, r.stderr
    assert "1 allowed" in r.stdout

    # an allowed function that got short again must leave the list
    (tmp_path / "k.cu").write_text("__global__ void kernel(int* p) {}\n")
    r = run()
    assert r.returncode == 1
    assert "no longer passes 80 lines" in r.stderr
