//go:build !linux

package redisproc

import "os/exec"

// dieWithParent: only Linux has a parent-death signal.
func dieWithParent(*exec.Cmd) {}
