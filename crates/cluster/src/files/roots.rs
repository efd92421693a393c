//! Which local files a node may read and write: the `--data-root` trees.
//!
//! Every local file Gyre reads or writes passes through the object store DataFusion
//! keeps for `file://`. A confined node replaces it with [`ConfinedFileSystem`], which
//! resolves each path (symlinks and `..`) and refuses any that leaves the roots, so
//! listings that meet a symlink out of a tree, scans and sinks are all held to them.
//! Statements check their locations up front as well ([`LocalFiles::check_location`]),
//! so that a refusal names the path the user wrote before anything is listed or created,
//! and workers check the plans they decode ([`LocalFiles::check_plan`]).
//!
//! Resolution happens when a path is used; a symlink created by someone with a shell on
//! the host between the check and the open is not caught (the roots confine SQL users,
//! not local ones).

use crate::files::FileCopyExec;
use crate::files::FileSplitScanExec;
use async_trait::async_trait;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSinkConfig};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::analyze::AnalyzeExec;
use datafusion::physical_plan::explain::ExplainExec;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// The local files a node may touch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LocalFiles {
    /// Any file the process may open: a node only this host reaches, and embedded
    /// clusters.
    #[default]
    Anywhere,
    /// Only files inside these trees (resolved); none at all when empty, the rule for a
    /// node other hosts reach that was given no `--data-root`.
    Within(Arc<[PathBuf]>),
}

impl LocalFiles {
    /// Files inside `roots`, each an existing directory, resolved once here.
    pub fn within(roots: &[PathBuf]) -> Result<Self> {
        let mut resolved = Vec::with_capacity(roots.len());
        for root in roots {
            let path = std::fs::canonicalize(root).map_err(|e| {
                DataFusionError::Configuration(format!("data root {}: {e}", root.display()))
            })?;
            if !path.is_dir() {
                return Err(DataFusionError::Configuration(format!(
                    "data root {} is not a directory",
                    root.display()
                )));
            }
            resolved.push(path);
        }
        Ok(Self::Within(resolved.into()))
    }

    /// No local file at all.
    pub fn nowhere() -> Self {
        Self::Within(Arc::from([]))
    }

    /// The policy of a node listening on `listen` with `roots` from its command line:
    /// the roots when given, else anywhere for a loopback listener and nowhere for one
    /// other hosts reach.
    pub fn for_listener(listen: std::net::IpAddr, roots: &[PathBuf]) -> Result<Self> {
        if !roots.is_empty() {
            Self::within(roots)
        } else if listen.is_loopback() {
            Ok(Self::Anywhere)
        } else {
            Ok(Self::nowhere())
        }
    }

    /// Checks a local path, which need not exist yet (a file about to be written): its
    /// nearest existing ancestor is resolved and the rest appended. Returns the resolved
    /// path.
    pub fn check(&self, path: &Path) -> std::result::Result<PathBuf, String> {
        let roots = match self {
            Self::Anywhere => return Ok(path.to_path_buf()),
            Self::Within(roots) => roots,
        };
        if roots.is_empty() {
            return Err(format!(
                "cannot use the local path '{}': this node serves other hosts and was started \
                 without --data-root, so it reads and writes no local files (give --data-root \
                 DIR, or use an object store URL)",
                path.display()
            ));
        }
        let resolved =
            resolve(path).map_err(|e| format!("cannot resolve '{}': {e}", path.display()))?;
        if roots.iter().any(|r| resolved.starts_with(r)) {
            return Ok(resolved);
        }
        let shown = if resolved.as_path() == path {
            format!("'{}'", path.display())
        } else {
            format!("'{}' (resolved: '{}')", path.display(), resolved.display())
        };
        Err(format!(
            "{shown} is outside the data roots ({})",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }

    /// Checks a statement's location (`LOCATION`, `COPY ... TO`): a local path, a glob
    /// over one (its directory is checked) or a `file://` URL. Other URLs name object
    /// stores, which have credentials of their own.
    pub fn check_location(&self, location: &str) -> Result<()> {
        if *self == Self::Anywhere {
            return Ok(());
        }
        let path = if is_local(location) {
            file_url_path(location).map_err(DataFusionError::Plan)?
        } else if location.contains("://") {
            return Ok(());
        } else {
            PathBuf::from(glob_directory(location))
        };
        self.check(&path).map(|_| ()).map_err(DataFusionError::Plan)
    }

    /// Checks a plan a worker decoded: file scans and sinks inside the roots, and no
    /// node that only the coordinator runs.
    pub fn check_plan(&self, plan: &Arc<dyn ExecutionPlan>) -> Result<()> {
        let mut refusal = None;
        plan.apply(|node| {
            if let Err(e) = self.check_node(node.as_ref()) {
                refusal = Some(e);
                return Ok(TreeNodeRecursion::Stop);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        match refusal {
            Some(why) => Err(DataFusionError::Execution(format!(
                "refusing a plan: {why}"
            ))),
            None => Ok(()),
        }
    }

    fn check_node(&self, node: &dyn ExecutionPlan) -> std::result::Result<(), String> {
        if node.is::<ExplainExec>() || node.is::<AnalyzeExec>() {
            return Err(format!(
                "{} runs on the coordinator, never on a worker",
                node.name()
            ));
        }
        if let Some(scan) = node.downcast_ref::<FileSplitScanExec>() {
            return self.check_scan(scan.config());
        }
        if let Some(source) = node.downcast_ref::<DataSourceExec>() {
            if let Some(config) = source.data_source().downcast_ref::<FileScanConfig>() {
                return self.check_scan(config);
            }
            return Ok(());
        }
        if let Some(copy) = node.downcast_ref::<FileCopyExec>() {
            return self.check_node(copy.template().as_ref());
        }
        if let Some(sink) = node.downcast_ref::<DataSinkExec>() {
            return match crate::files::copy::file_sink_config(sink.sink()) {
                Some(config) => self.check_sink(config),
                None => Err(
                    "a sink other than a Parquet, CSV or JSON file runs on the coordinator, \
                     never on a worker"
                        .to_string(),
                ),
            };
        }
        Ok(())
    }

    fn check_scan(&self, config: &FileScanConfig) -> std::result::Result<(), String> {
        if !is_local(config.object_store_url.as_str()) || *self == Self::Anywhere {
            return Ok(());
        }
        let fs = LocalFileSystem::new();
        for file in config.file_groups.iter().flat_map(|g| g.iter()) {
            let path = fs
                .path_to_filesystem(&file.object_meta.location)
                .map_err(|e| e.to_string())?;
            self.check(&path)?;
        }
        Ok(())
    }

    fn check_sink(&self, config: &FileSinkConfig) -> std::result::Result<(), String> {
        if !is_local(config.object_store_url.as_str()) || *self == Self::Anywhere {
            return Ok(());
        }
        for table in &config.table_paths {
            self.check(&file_url_path(table.as_str())?)?;
        }
        Ok(())
    }

    /// Makes `env` read and write local files only as this policy allows.
    pub fn confine(&self, env: &RuntimeEnv) {
        if *self == Self::Anywhere {
            return;
        }
        let url = url::Url::parse("file://").expect("file:// is a URL");
        env.register_object_store(
            &url,
            Arc::new(ConfinedFileSystem {
                inner: Arc::new(LocalFileSystem::new()),
                files: self.clone(),
            }),
        );
    }
}

fn is_local(url: &str) -> bool {
    url.starts_with("file://")
}

/// The local path a `file://` URL names.
fn file_url_path(url: &str) -> std::result::Result<PathBuf, String> {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.to_file_path().ok())
        .ok_or_else(|| format!("'{url}' is not a local file URL"))
}

/// The directory part of a location that may end in a glob (`/data/*.parquet`), as
/// DataFusion lists it.
fn glob_directory(location: &str) -> &str {
    match location.find(['*', '?', '[']) {
        Some(at) => match location[..at].rfind('/') {
            Some(slash) => &location[..=slash],
            None => ".",
        },
        None => location,
    }
}

/// `path` made absolute with every symlink and `..` resolved. The part that does not
/// exist yet is appended as written (it can hold no symlink); a dangling symlink in the
/// existing part is refused, since writing through it would land where it points.
fn resolve(path: &Path) -> io::Result<PathBuf> {
    let absolute = std::path::absolute(path)?;
    let components: Vec<Component> = absolute.components().collect();
    for existing in (1..=components.len()).rev() {
        let prefix: PathBuf = components[..existing].iter().collect();
        match std::fs::canonicalize(&prefix) {
            Ok(mut resolved) => {
                for c in &components[existing..] {
                    match c {
                        Component::Normal(name) => resolved.push(name),
                        Component::ParentDir => {
                            resolved.pop();
                        }
                        _ => {}
                    }
                }
                return Ok(resolved);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(io::Error::other(format!(
                        "'{}' is a symlink to a missing target",
                        prefix.display()
                    )));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("no part of the path exists"))
}

/// DataFusion's local file system, held to a [`LocalFiles`] policy: every path is
/// resolved and checked before the file system sees it, and every listed file too.
#[derive(Debug, Clone)]
pub struct ConfinedFileSystem {
    inner: Arc<LocalFileSystem>,
    files: LocalFiles,
}

impl fmt::Display for ConfinedFileSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfinedFileSystem({:?})", self.files)
    }
}

impl ConfinedFileSystem {
    fn check(&self, location: &StorePath) -> object_store::Result<()> {
        let path = self.inner.path_to_filesystem(location)?;
        self.files
            .check(&path)
            .map(|_| ())
            .map_err(|why| object_store::Error::PermissionDenied {
                path: path.display().to_string(),
                source: why.into(),
            })
    }
}

#[async_trait]
impl ObjectStore for ConfinedFileSystem {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.check(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.check(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &StorePath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.check(location)?;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &StorePath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        self.check(location)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        let me = self.clone();
        let checked = locations
            .map(move |l| l.and_then(|l| me.check(&l).map(|_| l)))
            .boxed();
        self.inner.delete_stream(checked)
    }

    fn list(
        &self,
        prefix: Option<&StorePath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        if let Some(p) = prefix
            && let Err(e) = self.check(p)
        {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let me = self.clone();
        self.inner
            .list(prefix)
            .map(move |m| m.and_then(|m| me.check(&m.location).map(|_| m)))
            .boxed()
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&StorePath>,
    ) -> object_store::Result<ListResult> {
        if let Some(p) = prefix {
            self.check(p)?;
        }
        let listed = self.inner.list_with_delimiter(prefix).await?;
        for m in &listed.objects {
            self.check(&m.location)?;
        }
        for p in &listed.common_prefixes {
            self.check(p)?;
        }
        Ok(listed)
    }

    async fn copy_opts(
        &self,
        from: &StorePath,
        to: &StorePath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &StorePath,
        to: &StorePath,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.check(from)?;
        self.check(to)?;
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;

    #[test]
    fn paths_are_resolved_before_they_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.csv"), "a\n1\n").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("gone"), root.join("dangling")).unwrap();
        let files = LocalFiles::within(std::slice::from_ref(&root)).unwrap();

        assert!(files.check(&root.join("sub")).is_ok());
        // Not there yet: a file about to be written.
        assert!(files.check(&root.join("sub/new/out.parquet")).is_ok());
        for bad in [
            root.join("../outside/secret.csv"),
            root.join("sub/../../outside"),
            root.join("link/secret.csv"),
            root.join("new/../../outside/x"),
            root.join("dangling/x"),
            PathBuf::from("/etc/passwd"),
        ] {
            let why = files.check(&bad).unwrap_err();
            assert!(
                why.contains("outside the data roots") || why.contains("symlink"),
                "{}: {why}",
                bad.display()
            );
        }
        let why = LocalFiles::nowhere().check(&root).unwrap_err();
        assert!(why.contains("without --data-root"), "{why}");
        assert!(LocalFiles::Anywhere.check(Path::new("/etc/passwd")).is_ok());
    }

    #[test]
    fn locations_name_globs_urls_and_object_stores() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let files = LocalFiles::within(std::slice::from_ref(&root)).unwrap();
        let inside = format!("{}/*.parquet", root.display());
        assert!(files.check_location(&inside).is_ok());
        assert!(
            files
                .check_location(&format!("file://{}/", root.display()))
                .is_ok()
        );
        assert!(files.check_location("s3://bucket/data/").is_ok());
        for bad in ["/etc/*.conf", "file:///etc/passwd", "/etc/passwd"] {
            let e = files.check_location(bad).unwrap_err().to_string();
            assert!(e.contains("outside the data roots"), "{bad}: {e}");
        }
        assert_eq!(glob_directory("/a/b/*.csv"), "/a/b/");
        assert_eq!(glob_directory("x[12].csv"), ".");
    }

    #[test]
    fn the_policy_follows_the_listener() {
        let loopback = "127.0.0.1".parse().unwrap();
        let public = "10.0.0.1".parse().unwrap();
        assert_eq!(
            LocalFiles::for_listener(loopback, &[]).unwrap(),
            LocalFiles::Anywhere
        );
        assert_eq!(
            LocalFiles::for_listener(public, &[]).unwrap(),
            LocalFiles::nowhere()
        );
        let dir = tempfile::tempdir().unwrap();
        let roots = [dir.path().to_path_buf()];
        assert!(matches!(
            LocalFiles::for_listener(public, &roots).unwrap(),
            LocalFiles::Within(r) if r.len() == 1
        ));
        assert!(LocalFiles::within(&[dir.path().join("missing")]).is_err());
    }

    #[tokio::test]
    async fn the_confined_store_refuses_listed_files_behind_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("ok.csv"), "a\n1\n").unwrap();
        std::fs::write(outside.join("secret.csv"), "a\n2\n").unwrap();
        let files = LocalFiles::within(std::slice::from_ref(&root)).unwrap();
        let store = ConfinedFileSystem {
            inner: Arc::new(LocalFileSystem::new()),
            files,
        };
        let prefix = StorePath::from_filesystem_path(&root).unwrap();
        let listed: Vec<_> = store.list(Some(&prefix)).collect().await;
        assert_eq!(listed.len(), 1);
        assert!(listed[0].is_ok());
        let ok = StorePath::from_filesystem_path(root.join("ok.csv")).unwrap();
        assert!(store.get(&ok).await.is_ok());

        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let listed: Vec<_> = store.list(Some(&prefix)).collect().await;
        assert!(
            listed
                .iter()
                .any(|m| m.as_ref().is_err_and(|e| e.to_string().contains("outside"))),
            "{listed:?}"
        );
        let secret = StorePath::from_filesystem_path(outside.join("secret.csv")).unwrap();
        let e = store.get(&secret).await.unwrap_err().to_string();
        assert!(e.contains("outside the data roots"), "{e}");
        let out = StorePath::from_absolute_path(outside.join("new.csv")).unwrap();
        assert!(store.put(&out, "x".into()).await.is_err());
        assert!(!outside.join("new.csv").exists());
    }

    #[tokio::test]
    async fn workers_refuse_plans_that_reach_outside_or_only_the_coordinator_runs() {
        use datafusion::prelude::{CsvReadOptions, SessionContext};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("a.csv"), "k\n1\n").unwrap();
        std::fs::write(outside.join("b.csv"), "k\n2\n").unwrap();
        let files = LocalFiles::within(std::slice::from_ref(&root)).unwrap();
        let ctx = SessionContext::new();
        let csv = CsvReadOptions::new();
        let inside = root.join("a.csv");
        let other = outside.join("b.csv");
        ctx.register_csv("inside", inside.to_str().unwrap(), csv.clone())
            .await
            .unwrap();
        ctx.register_csv("other", other.to_str().unwrap(), csv)
            .await
            .unwrap();
        let plan = |sql: String| {
            let ctx = ctx.clone();
            async move {
                ctx.sql(&sql)
                    .await
                    .unwrap()
                    .create_physical_plan()
                    .await
                    .unwrap()
            }
        };
        let ok = plan("SELECT k + 1 FROM inside".into()).await;
        assert!(files.check_plan(&ok).is_ok());
        assert!(LocalFiles::Anywhere.check_plan(&ok).is_ok());
        let out = root.join("out.csv");
        let write = plan(format!("COPY inside TO '{}'", out.display())).await;
        assert!(files.check_plan(&write).is_ok());
        for (sql, why) in [
            ("SELECT * FROM other".to_string(), "outside the data roots"),
            (
                format!("COPY inside TO '{}'", outside.join("x.csv").display()),
                "outside the data roots",
            ),
            ("EXPLAIN SELECT 1".to_string(), "never on a worker"),
        ] {
            let e = files.check_plan(&plan(sql.clone()).await).unwrap_err();
            assert!(e.to_string().contains(why), "{sql}: {e}");
        }
        let e = LocalFiles::nowhere().check_plan(&ok).unwrap_err();
        assert!(e.to_string().contains("without --data-root"), "{e}");
    }
}
