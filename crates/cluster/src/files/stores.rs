//! Object stores for table locations and COPY targets beyond the local file system:
//! `s3://` (and S3-compatible servers), `gs://`, `az://` / `abfs://`, `http(s)://`.
//!
//! Each node builds its own store from its environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_ENDPOINT`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ... as
//! object_store's builders read them) and from the statement's options, named as in
//! DataFusion's CLI: `'aws.access_key_id'`, `'aws.secret_access_key'`, `'aws.region'`,
//! `'aws.endpoint'`, `'aws.allow_http'`, `'gcp.service_account_path'`,
//! `'azure.account_name'`, ... (any key of the builder, after the prefix). The
//! coordinator builds the store to list and plan, then hands the same options to the
//! workers of the statement, which build theirs to read or write.

use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::execution::runtime_env::RuntimeEnv;
use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::{ClientConfigKey, ClientOptions};
use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::Arc;
use url::Url;

/// Option prefixes that configure object stores rather than file formats.
const PREFIXES: [&str; 4] = ["aws.", "gcp.", "azure.", "http."];

/// Removes the object store options from a statement's options (the file formats
/// would reject them) and returns them.
pub fn take_store_options(options: &mut HashMap<String, String>) -> BTreeMap<String, String> {
    let keys: Vec<String> = options
        .keys()
        .filter(|k| {
            PREFIXES
                .iter()
                .any(|p| k.to_ascii_lowercase().starts_with(p))
        })
        .cloned()
        .collect();
    keys.into_iter()
        .filter_map(|k| options.remove(&k).map(|v| (k.to_ascii_lowercase(), v)))
        .collect()
}

/// The URL of a location if it needs an object store of its own (not the local file
/// system), else `None`.
pub fn remote_url(location: &str) -> Result<Option<Url>> {
    match Url::parse(location) {
        Ok(url) if url.scheme() != "file" && url.scheme().len() > 1 => Ok(Some(url)),
        // A Windows drive letter or a plain path: the local file system.
        _ => Ok(None),
    }
}

fn bad_option(key: &str, scheme: &str) -> DataFusionError {
    DataFusionError::Plan(format!(
        "unknown option '{key}' for a {scheme}:// location (the options are object_store's \
         configuration keys, e.g. 'aws.region', 'aws.endpoint', 'aws.access_key_id')"
    ))
}

/// Options under `prefix`, without it.
fn under<'a>(
    options: &'a BTreeMap<String, String>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, &'a String)> {
    options
        .iter()
        .filter_map(move |(k, v)| k.strip_prefix(prefix).map(|k| (k, v)))
}

/// Builds the store that serves `url` (its scheme and host: `s3://bucket`).
pub fn build_store(url: &Url, options: &BTreeMap<String, String>) -> Result<Arc<dyn ObjectStore>> {
    let scheme = url.scheme();
    let store_err = |e: object_store::Error| {
        DataFusionError::Execution(format!("cannot set up the object store for {url}: {e}"))
    };
    let other: Vec<&String> = options
        .keys()
        .filter(|k| {
            let wanted = match scheme {
                "s3" | "s3a" => "aws.",
                "gs" => "gcp.",
                "az" | "adl" | "azure" | "abfs" | "abfss" => "azure.",
                _ => "http.",
            };
            !k.starts_with(wanted)
        })
        .collect();
    if let Some(k) = other.first() {
        return Err(bad_option(k, scheme));
    }
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" | "s3a" => {
            let mut b = AmazonS3Builder::from_env().with_url(url.as_str());
            for (k, v) in under(options, "aws.") {
                let key = AmazonS3ConfigKey::from_str(k)
                    .or_else(|_| AmazonS3ConfigKey::from_str(&format!("aws_{k}")))
                    .map_err(|_| bad_option(&format!("aws.{k}"), scheme))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        "gs" => {
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url.as_str());
            for (k, v) in under(options, "gcp.") {
                let key = GoogleConfigKey::from_str(k)
                    .or_else(|_| GoogleConfigKey::from_str(&format!("google_{k}")))
                    .map_err(|_| bad_option(&format!("gcp.{k}"), scheme))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        "az" | "adl" | "azure" | "abfs" | "abfss" => {
            let mut b = MicrosoftAzureBuilder::from_env().with_url(url.as_str());
            for (k, v) in under(options, "azure.") {
                let key = AzureConfigKey::from_str(k)
                    .or_else(|_| AzureConfigKey::from_str(&format!("azure_{k}")))
                    .map_err(|_| bad_option(&format!("azure.{k}"), scheme))?;
                b = b.with_config(key, v);
            }
            Arc::new(b.build().map_err(store_err)?)
        }
        "http" | "https" => {
            let mut client = ClientOptions::new();
            for (k, v) in under(options, "http.") {
                let key = ClientConfigKey::from_str(k)
                    .map_err(|_| bad_option(&format!("http.{k}"), scheme))?;
                client = client.with_config(key, v);
            }
            let base = &url[..url::Position::BeforePath];
            Arc::new(
                HttpBuilder::new()
                    .with_url(base)
                    .with_client_options(client)
                    .build()
                    .map_err(store_err)?,
            )
        }
        other => {
            return plan_err!(
                "locations of scheme '{other}://' are not supported (file paths, s3://, gs://, \
                 az://, abfs://, http(s):// are)"
            );
        }
    };
    Ok(store)
}

/// Builds the store for `location` (if remote) and registers it with `runtime`.
pub fn register_store(
    runtime: &RuntimeEnv,
    location: &str,
    options: &BTreeMap<String, String>,
) -> Result<()> {
    let Some(url) = remote_url(location)? else {
        if let Some(k) = options.keys().next() {
            return plan_err!("option '{k}' applies to object stores, not to local files");
        }
        return Ok(());
    };
    // A statement without options keeps a store an earlier one set up (with its
    // credentials); one with options replaces it.
    if options.is_empty() && runtime.object_store_registry.get_store(&url).is_ok() {
        return Ok(());
    }
    let store = build_store(&url, options)?;
    runtime.register_object_store(&url, store);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_options_leave_the_format_options_alone() {
        let mut options: HashMap<String, String> = [
            ("format.has_header", "true"),
            ("aws.region", "eu-west-1"),
            ("AWS.Endpoint", "http://127.0.0.1:9000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let taken = take_store_options(&mut options);
        assert_eq!(options.len(), 1);
        assert_eq!(taken.len(), 2);
        assert_eq!(taken["aws.endpoint"], "http://127.0.0.1:9000");
    }

    #[test]
    fn stores_are_built_from_options_and_bad_keys_are_named() {
        let url = Url::parse("s3://bucket/prefix/").unwrap();
        let mut options = BTreeMap::new();
        options.insert("aws.region".to_string(), "us-east-1".to_string());
        options.insert("aws.endpoint".to_string(), "http://127.0.0.1:1".to_string());
        options.insert("aws.allow_http".to_string(), "true".to_string());
        options.insert("aws.access_key_id".to_string(), "k".to_string());
        options.insert("aws.secret_access_key".to_string(), "s".to_string());
        build_store(&url, &options).unwrap();
        options.insert("aws.colour".to_string(), "blue".to_string());
        let e = build_store(&url, &options).unwrap_err().to_string();
        assert!(e.contains("'aws.colour'"), "{e}");
        let e = build_store(&Url::parse("ftp://x/").unwrap(), &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("ftp"), "{e}");
        assert!(remote_url("/tmp/x.parquet").unwrap().is_none());
        assert!(remote_url("file:///tmp/x").unwrap().is_none());
        assert!(remote_url("s3://b/x").unwrap().is_some());
    }
}
