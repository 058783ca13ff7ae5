package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"syscall"
)

// command is one subcommand. run gets the arguments after the subcommand's name and
// returns the process exit status.
type command struct {
	summary  string // one line: `kvindex -h` and doc.go
	synopsis string // the arguments, after "usage: kvindex NAME"
	about    string // a paragraph: what the command does, for `kvindex NAME -h`
	run      func(args []string, stdout, stderr io.Writer) int
}

// commands is the subcommand table, filled by register (cli.go holds every entry).
var commands = map[string]command{}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(stdout)
		return 0
	case "--version", "-version":
		args[0] = "version"
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "kvindex: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if path := os.Getenv(cpuProfileEnv); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			fmt.Fprintf(stderr, "kvindex: %s: %v\n", cpuProfileEnv, err)
			return 1
		}
		defer stop()
	}
	return c.run(args[1:], stdout, stderr)
}

// cpuProfileEnv names a file to write a CPU profile of the whole command to: `kvindex
// loadtest --serve-cpuprofile` sets it for its serve child.
const cpuProfileEnv = "KVINDEX_CPUPROFILE"

// startCPUProfile starts the CPU profile of cpuProfileEnv; stop ends it.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvindex COMMAND [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'kvindex COMMAND -h' for a command's flags.")
}

// untilSignal adapts a long-running command to the table: it runs until SIGTERM or
// SIGINT cancels its context.
func untilSignal(run func(ctx context.Context, args []string, stdout, stderr io.Writer) int) func([]string, io.Writer, io.Writer) int {
	return func(args []string, stdout, stderr io.Writer) int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return run(ctx, args, stdout, stderr)
	}
}
