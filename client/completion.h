// Shell completion for the tessera command line, generated from its CLI11 definition so
// that it cannot drift from the commands: `tessera completion bash` (source it, or put it
// in /etc/bash_completion.d) and `tessera completion zsh` (the same through bashcompinit).
// It completes subcommands and options at every level, and file names after -f/--file,
// --config and --ca-cert and for the job-file argument of plan and local.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

namespace tessera::client {
// The script for `shell` ("bash" or "zsh"); empty for another shell.
std::string CompletionScript(const CLI::App& app, const std::string& prog, const std::string& shell);
}  // namespace tessera::client
