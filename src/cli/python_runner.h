// The one place mmtrain starts Python. The project's Python is one package, mmtrain_py
// (python/mmtrain_py: media/ decodes clips and runs the VAEs and the text encoder, dcp/ runs
// PyTorch's DCP code, plots/ draws figures), which the build copies to share/mmtrain/python. A
// module runs as
//   <interpreter> -P -m mmtrain_py.<module> --flag=value ...     PYTHONPATH=<package dir>:$PYTHONPATH
//   interpreter: $MMTRAIN_PYTHON, else the venv the build was configured with
//   package dir: $MMTRAIN_PYTHON_PACKAGE (a directory holding mmtrain_py), else share/mmtrain/python
// -P keeps the working directory off sys.path: a data set that ships av.py or torch.py is never
// imported from where the command runs (docs/security.md). Python >= 3.11.
#pragma once
#include "core/subprocess.h"

#include <string>
#include <vector>

namespace mmtrain {

// The interpreter every start uses.
std::string project_python();

// The directory holding the package mmtrain_py.
std::string python_package_dir();

// A double written so that parsing it gives the same double back (%.17g), for a module's flags.
std::string argument_number(double value);

// Replaces this process with the module (`module` is relative to mmtrain_py: "media.prepare").
// Never returns.
[[noreturn]] void exec_python_module(const std::string& module, const std::vector<std::string>& args);

// Runs the module and waits, its output in `log` (removed after). When it fails, fails with
// "<what> failed (exit status N): <what it printed>".
void run_python_module(const std::string& module, const std::vector<std::string>& args, const std::string& log,
                       const std::string& what);

// Runs the module with `input` on its stdin and its output on ours, and waits; fails naming `what`
// when it cannot start or fails.
void run_python_module_with_input(const std::string& module, const std::string& input, const std::string& what);

// Runs `<interpreter> -P args...` (a module of the interpreter's own, like torch.distributed.run)
// and returns its exit status (core/subprocess.h); 127 when it cannot start.
int run_python(const std::vector<std::string>& args, const ProcessOptions& options);

}  // namespace mmtrain
