package main

import (
	"fmt"
	"io"
)

func runBackup(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "berthd backup: not built yet")
	return 1
}

func runRestore(_ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "berthd restore: not built yet")
	return 1
}
