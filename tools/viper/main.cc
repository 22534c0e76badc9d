// viper: the command-line front end (cli_main.cc); its commands are the cmd_*.cc and node_cmd_*.cc
// files beside this one.
#include "command.h"

int main(int argc, char** argv) { return viper::cli::RunCli(argc, argv); }
