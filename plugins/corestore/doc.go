// Package corestore is the Corestore provider plugin: databases and buckets
// that services bind (PostgreSQL, MongoDB-wire and S3 servers it is configured
// with), each made under a grant, with credentials handed back once.
//
// Resource types are those of abi/bindings (corestore.postgres, .mongodb, .s3), ids
// "<project>/<service>/<binding>"; corestore.inventory reads what a server holds.
// docs/bindings.md describes the contract; backups live in the backup
// subpackage.
package corestore
