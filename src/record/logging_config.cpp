#include "record/logging_config.h"

#include "core/config_schema.h"

namespace mmtrain {

void LoggingConfig::declare(ConfigSection<LoggingConfig>& s) {
  s.field("output_dir", &LoggingConfig::output_dir)
      .field("progress", &LoggingConfig::progress)
      .field("hardware_flops", &LoggingConfig::hardware_flops)
      .field("tensorboard", &LoggingConfig::tensorboard)
      .field("device_profile", &LoggingConfig::device_profile)
      .check([](const LoggingConfig& l, const ConfigCheck& check) {
        if (!(l.hardware_flops >= 0.0))
          check.invalid("hardware_flops", ">= 0 (0 = no MFU)", ConfigCheck::number(l.hardware_flops));
        if (l.output_dir.empty()) check.invalid("output_dir", "a directory", "nothing");
      });
}

}  // namespace mmtrain
