package main

import "os"

// serveChildEnv, set in a test's environment, makes this test binary run as
// `kvindex serve` when it is started with "serve" as its first argument: what
// `kvindex loadtest --server exec` does with os.Executable (TestHelpValuesAreAccepted).
const serveChildEnv = "KVINDEX_TEST_AS_SERVE"

func init() {
	if len(os.Args) > 1 && os.Args[1] == "serve" && os.Getenv(serveChildEnv) == "1" {
		os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
	}
}
