// Package clock reads the wall clock as cheaply as the platform allows: the
// local path of a limiter reads it on every decision.
package clock
