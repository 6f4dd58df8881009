package core

// Version is holdfast's release, in semantic versioning. CHANGELOG.md lists
// what each release changed.
const Version = "0.2.0-dev"
