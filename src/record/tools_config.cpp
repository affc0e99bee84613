#include "record/tools_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void ProfileConfig::declare(ConfigSection<ProfileConfig>& s) {
  using P = ProfileConfig;
  s.field("enable", &P::enable)
      .field("ranks", &P::ranks)
      .field("start_step", &P::start_step)
      .field("end_step", &P::end_step)
      .field("record_shapes", &P::record_shapes)
      .field("with_memory", &P::with_memory)
      .field("with_stack", &P::with_stack)
      .field("save_path", &P::save_path)
      .check([](const P& p, const ConfigCheck& check) {
        check.at_least("start_step", p.start_step, 1);
        check.at_least("end_step", p.end_step, p.start_step);
        for (size_t i = 0; i < p.ranks.size(); ++i)
          check.at_least("ranks[" + std::to_string(i) + "]", p.ranks[i], -1);
        if (p.enable && p.ranks.empty()) check.invalid("ranks", "at least one rank (or -1 for every rank)", "[]");
      });
}

void MemoryProfileConfig::declare(ConfigSection<MemoryProfileConfig>& s) {
  using M = MemoryProfileConfig;
  s.field("enable", &M::enable)
      .field("start_step", &M::start_step)
      .field("end_step", &M::end_step)
      .check([](const M& m, const ConfigCheck& check) {
        check.at_least("start_step", m.start_step, 1);
        if (m.end_step != 0 && m.end_step < m.start_step)
          check.invalid("end_step", "0 (through the last iteration) or >= start_step " + std::to_string(m.start_step),
                        std::to_string(m.end_step));
      });
}

void ToolsConfig::declare(ConfigSection<ToolsConfig>& s) {
  s.section("profile", &ToolsConfig::profile, ProfileConfig::declare)
      .section("memory_profile", &ToolsConfig::memory_profile, MemoryProfileConfig::declare);
}

}  // namespace mmtrain
