// Registers every built-in model, dataset and collator (idempotent). Explicit, not static
// initialisers: mmtrain_lib is a static library and unreferenced registrars would be dropped.
#pragma once

namespace mmtrain {
void register_builtins();
}
