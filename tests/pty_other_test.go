//go:build !linux

package tests

import (
	"errors"
	"os"
)

// openPTY is implemented for Linux only.
func openPTY() (master, slave *os.File, err error) {
	return nil, nil, errors.New("open pty: implemented for Linux only")
}
