//! The redaction table: command lines people actually run with secrets in
//! them, what each must read as after [`sanitize_argv`](crate::sanitize_argv),
//! and ordinary command lines that must stay readable.
//!
//! One table for every proof: the unit test checks each row exactly; the
//! Report, Event, push and log tests drive every row through their output
//! path and check that no secret arrives; `docs/redaction.md` shows the
//! table as the test renders it (a test fails when they differ). Built with
//! the `redaction-cases` feature (for other crates' tests and fuzz seeds).

/// One row of the table.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The rule the row shows.
    pub rule: &'static str,
    /// The argument vector, as the exec tracer reports it.
    pub argv: &'static [&'static str],
    /// What [`sanitize_argv`](crate::sanitize_argv) must make of it.
    pub redacted: &'static [&'static str],
    /// What must appear in no output (empty for a row that stays readable).
    pub secrets: &'static [&'static str],
}

impl Case {
    /// The argument vector as owned strings.
    pub fn argv(&self) -> Vec<String> {
        self.argv.iter().map(|s| s.to_string()).collect()
    }

    /// Whether the row must come out unchanged.
    pub fn stays_readable(&self) -> bool {
        self.secrets.is_empty()
    }
}

/// Every secret of every row.
pub fn all_secrets() -> impl Iterator<Item = &'static str> {
    CASES.iter().flat_map(|c| c.secrets.iter().copied())
}

macro_rules! case {
    ($rule:expr, [$($a:expr),* $(,)?] => [$($r:expr),* $(,)?], secrets [$($s:expr),* $(,)?]) => {
        Case { rule: $rule, argv: &[$($a),*], redacted: &[$($r),*], secrets: &[$($s),*] }
    };
    ($rule:expr, [$($a:expr),* $(,)?] stays) => {
        Case { rule: $rule, argv: &[$($a),*], redacted: &[$($a),*], secrets: &[] }
    };
}

/// The table: masked rows first, then rows that stay readable.
pub const CASES: &[Case] = &[
    // Program rules: short flags whose meaning depends on the program.
    case!("mysql -p, value attached", ["mysql", "-uroot", "-pPw01mysql", "-h", "db"]
        => ["mysql", "-uroot", "-p***", "-h", "db"], secrets ["Pw01mysql"]),
    case!("mysql -p, value next", ["mysqldump", "-u", "root", "-p", "Pw02mysql", "shop"]
        => ["mysqldump", "-u", "root", "-p", "***", "shop"], secrets ["Pw02mysql"]),
    case!("sshpass -p", ["sshpass", "-p", "Pw03sshpass", "ssh", "deploy@10.0.0.5"]
        => ["sshpass", "-p", "***", "ssh", "deploy@10.0.0.5"], secrets ["Pw03sshpass"]),
    case!("docker login -p", ["docker", "login", "-u", "ci", "-p", "Pw04docker", "registry.example.com"]
        => ["docker", "login", "-u", "ci", "-p", "***", "registry.example.com"], secrets ["Pw04docker"]),
    case!("redis-cli -a (its -p is a port)", ["redis-cli", "-h", "cache", "-p", "6379", "-a", "Pw05redis", "ping"]
        => ["redis-cli", "-h", "cache", "-p", "6379", "-a", "***", "ping"], secrets ["Pw05redis"]),
    case!("openssl -k", ["openssl", "enc", "-aes-256-cbc", "-k", "Pw06openssl", "-in", "db.sql"]
        => ["openssl", "enc", "-aes-256-cbc", "-k", "***", "-in", "db.sql"], secrets ["Pw06openssl"]),
    case!("openssl -passout pass:", ["openssl", "pkcs12", "-export", "-inkey", "tls.key", "-passout", "pass:Pw07openssl"]
        => ["openssl", "pkcs12", "-export", "-inkey", "tls.key", "-passout", "***"], secrets ["Pw07openssl"]),
    case!("ldapsearch -w", ["ldapsearch", "-x", "-D", "cn=admin,dc=example,dc=org", "-w", "Pw08ldap", "-b", "dc=example,dc=org"]
        => ["ldapsearch", "-x", "-D", "cn=admin,dc=example,dc=org", "-w", "***", "-b", "dc=example,dc=org"], secrets ["Pw08ldap"]),
    case!("sqlcmd -P", ["sqlcmd", "-S", "db", "-U", "sa", "-P", "Pw09sqlcmd", "-Q", "SELECT 1"]
        => ["sqlcmd", "-S", "db", "-U", "sa", "-P", "***", "-Q", "SELECT 1"], secrets ["Pw09sqlcmd"]),
    case!("mosquitto_pub -P (its -p is a port)", ["mosquitto_pub", "-h", "broker", "-p", "1883", "-u", "iot", "-P", "Pw10mqtt", "-t", "lights"]
        => ["mosquitto_pub", "-h", "broker", "-p", "1883", "-u", "iot", "-P", "***", "-t", "lights"], secrets ["Pw10mqtt"]),
    case!("ssh-keygen -N", ["ssh-keygen", "-t", "ed25519", "-N", "Pw11keygen", "-f", "/root/.ssh/id_ed25519"]
        => ["ssh-keygen", "-t", "ed25519", "-N", "***", "-f", "/root/.ssh/id_ed25519"], secrets ["Pw11keygen"]),
    case!("7z -p, attached only", ["7z", "x", "-pPw12zip", "backup.7z"]
        => ["7z", "x", "-p***", "backup.7z"], secrets ["Pw12zip"]),
    case!("useradd -p (a password hash)", ["useradd", "-m", "-p", "$6$Pw13salt$Pw13hash", "app"]
        => ["useradd", "-m", "-p", "***", "app"], secrets ["Pw13salt", "Pw13hash"]),
    case!("curl -b (a cookie)", ["curl", "-b", "sid=Pw14cookie", "https://shop.example.com/"]
        => ["curl", "-b", "***", "https://shop.example.com/"], secrets ["Pw14cookie"]),
    case!("-p of an unknown program, not a port", ["./backup-agent", "--host", "db", "-p", "Pw15unknown"]
        => ["./backup-agent", "--host", "db", "-p", "***"], secrets ["Pw15unknown"]),
    // Credentials `user:password`.
    case!("curl --user=", ["curl", "--user=admin:Pw16curl", "https://api.example.com/v1"]
        => ["curl", "--user=admin:***", "https://api.example.com/v1"], secrets ["Pw16curl"]),
    case!("curl -u, value attached", ["curl", "-uadmin:Pw17curl", "https://api.example.com/v1"]
        => ["curl", "-uadmin:***", "https://api.example.com/v1"], secrets ["Pw17curl"]),
    case!("curl -E file:password", ["curl", "-E", "/etc/tls/client.pem:Pw18cert", "https://mtls.example.com"]
        => ["curl", "-E", "/etc/tls/client.pem:***", "https://mtls.example.com"], secrets ["Pw18cert"]),
    case!("etcdctl --user", ["etcdctl", "--user", "root:Pw19etcd", "get", "/registry"]
        => ["etcdctl", "--user", "root:***", "get", "/registry"], secrets ["Pw19etcd"]),
    case!("httpie -a", ["http", "-a", "admin:Pw20httpie", "GET", "https://api.example.com/x"]
        => ["http", "-a", "admin:***", "GET", "https://api.example.com/x"], secrets ["Pw20httpie"]),
    case!("smbclient -U user%password", ["smbclient", "//fs/share", "-U", "alice%Pw21smb"]
        => ["smbclient", "//fs/share", "-U", "alice%***"], secrets ["Pw21smb"]),
    case!("sqlplus user/password@db", ["sqlplus", "-s", "scott/Pw22oracle@//db:1521/ORCL"]
        => ["sqlplus", "-s", "scott/***@//db:1521/ORCL"], secrets ["Pw22oracle"]),
    case!("user:password@host without a scheme", ["./loader", "--dsn", "app:Pw23dsn@db.internal:5432/shop"]
        => ["./loader", "--dsn", "app:***@db.internal:5432/shop"], secrets ["Pw23dsn"]),
    case!("a Go DSN", ["./server", "-db", "root:Pw24dsn@tcp(mysql:3306)/app"]
        => ["./server", "-db", "root:***@tcp(mysql:3306)/app"], secrets ["Pw24dsn"]),
    // Shell command lines.
    case!("sh -c: each command gets the argv rules", ["sh", "-c", "mysql -uroot -pPw25shell -e 'select 1' && curl -u bob:Pw25curl http://svc/health"]
        => ["sh", "-c", "mysql -uroot -p*** -e 'select 1' && curl -u bob:*** http://svc/health"], secrets ["Pw25shell", "Pw25curl"]),
    case!("sh -c: docker login in a script", ["/bin/sh", "-c", "echo start; docker login -u ci -p Pw26docker registry.local && docker push app"]
        => ["/bin/sh", "-c", "echo start; docker login -u ci -p *** registry.local && docker push app"], secrets ["Pw26docker"]),
    case!("kubectl exec -- sh -c, nested quotes", ["kubectl", "exec", "db-0", "--", "sh", "-c", "MYSQL_PWD=Pw27nested mysql -uroot -e \"SHOW DATABASES\""]
        => ["kubectl", "exec", "db-0", "--", "sh", "-c", "MYSQL_PWD=*** mysql -uroot -e \"SHOW DATABASES\""], secrets ["Pw27nested"]),
    case!("ssh remote command", ["ssh", "db-host", "mysql -uroot -pPw28remote shop"]
        => ["ssh", "db-host", "mysql -uroot -p*** shop"], secrets ["Pw28remote"]),
    case!("bash -c with $(...) inside double quotes", ["bash", "-c", "echo \"$(sshpass -p 'Pw29sub' ssh h uptime)\""]
        => ["bash", "-c", "echo \"$(sshpass -p *** ssh h uptime)\""], secrets ["Pw29sub"]),
    // Generic rules: secret-named flags and assignments.
    case!("--pwd", ["./app", "--pwd", "Pw30pwd", "--port", "8080"]
        => ["./app", "--pwd", "***", "--port", "8080"], secrets ["Pw30pwd"]),
    case!("--key (not a key file)", ["./signer", "--key", "Pw31key", "--in", "payload.json"]
        => ["./signer", "--key", "***", "--in", "payload.json"], secrets ["Pw31key"]),
    case!("-storepass, -pw: single-dash names", ["keytool", "-list", "-storepass", "Pw32store", "-pw", "Pw32pw"]
        => ["keytool", "-list", "-storepass", "***", "-pw", "***"], secrets ["Pw32store", "Pw32pw"]),
    case!("MYSQL_PWD=", ["env", "MYSQL_PWD=Pw33env", "mysql", "-uroot"]
        => ["env", "MYSQL_PWD=***", "mysql", "-uroot"], secrets ["Pw33env"]),
    case!("Pwd= in a connection string", ["./migrate", "--conn", "Server=db;Database=shop;Uid=sa;Pwd=Pw34odbc;"]
        => ["./migrate", "--conn", "Server=db;Database=shop;Uid=sa;Pwd=***;"], secrets ["Pw34odbc"]),
    case!("PGPASSWORD= (psql's -p is a port)", ["env", "PGPASSWORD=Pw35pg", "psql", "-h", "db", "-p", "5432"]
        => ["env", "PGPASSWORD=***", "psql", "-h", "db", "-p", "5432"], secrets ["Pw35pg"]),
    case!("-Dx.password=", ["java", "-Dspring.datasource.password=Pw36java", "-jar", "/app/app.jar"]
        => ["java", "-Dspring.datasource.password=***", "-jar", "/app/app.jar"], secrets ["Pw36java"]),
    case!("a secret in a URL query", ["wget", "https://example.com/export.csv?access_token=Pw37query&page=2"]
        => ["wget", "https://example.com/export.csv?access_token=***&page=2"], secrets ["Pw37query"]),
    case!("kubectl create secret --from-literal", ["kubectl", "create", "secret", "generic", "db", "--from-literal=user=app", "--from-literal=password=Pw38kube"]
        => ["kubectl", "create", "secret", "generic", "db", "--from-literal=user=***", "--from-literal=password=***"], secrets ["Pw38kube"]),
    case!("aws configure set <secret key> <value>", ["aws", "configure", "set", "aws_secret_access_key", "Pw39aws"]
        => ["aws", "configure", "set", "aws_secret_access_key", "***"], secrets ["Pw39aws"]),
    case!("npm config set <auth token key> <value>", ["npm", "config", "set", "//npm.internal.example/:_authToken", "Pw40npm"]
        => ["npm", "config", "set", "//npm.internal.example/:_authToken", "***"], secrets ["Pw40npm"]),
    case!("htpasswd -b: the last argument", ["htpasswd", "-bc", "/etc/nginx/.htpasswd", "admin", "Pw41htpasswd"]
        => ["htpasswd", "-bc", "/etc/nginx/.htpasswd", "admin", "***"], secrets ["Pw41htpasswd"]),
    case!("vault login <token>", ["vault", "login", "Pw42vault"]
        => ["vault", "login", "***"], secrets ["Pw42vault"]),
    case!("redis-cli AUTH <password>", ["redis-cli", "-h", "cache", "AUTH", "Pw43redis"]
        => ["redis-cli", "-h", "cache", "AUTH", "***"], secrets ["Pw43redis"]),
    case!("mc alias set <name> <url> <access key> <secret key>", ["mc", "alias", "set", "minio", "http://minio:9000", "Pw44access", "Pw44secret"]
        => ["mc", "alias", "set", "minio", "http://minio:9000", "***", "***"], secrets ["Pw44access", "Pw44secret"]),
    // Headers and cookies.
    case!("-H 'Authorization: Bearer'", ["curl", "-H", "Authorization: Bearer Pw45bearer", "https://api.example.com"]
        => ["curl", "-H", "Authorization: Bearer ***", "https://api.example.com"], secrets ["Pw45bearer"]),
    case!("--header=Authorization: Basic", ["wget", "--header=Authorization: Basic UHc0NmJhc2ljOnB3", "https://example.com/f"]
        => ["wget", "--header=Authorization: Basic ***", "https://example.com/f"], secrets ["UHc0NmJhc2ljOnB3"]),
    case!("Cookie: the whole list", ["curl", "--header", "Cookie: session=Pw47cookie; csrf=Pw47csrf", "https://shop.example.com/"]
        => ["curl", "--header", "Cookie: ***", "https://shop.example.com/"], secrets ["Pw47cookie", "Pw47csrf"]),
    case!("X-Api-Key:", ["curl", "-H", "X-Api-Key: Pw48apikey", "https://api.example.com"]
        => ["curl", "-H", "X-Api-Key: ***", "https://api.example.com"], secrets ["Pw48apikey"]),
    case!("a header split over arguments", ["curl", "-H", "Authorization:", "Bearer", "Pw49split"]
        => ["curl", "-H", "Authorization:", "Bearer", "***"], secrets ["Pw49split"]),
    // Token shapes, wherever they stand.
    case!("GitLab glpat-", ["./release", "--gitlab", "glpat-Pw50glpatAbcdefghij"]
        => ["./release", "--gitlab", "glpat-***"], secrets ["Pw50glpat"]),
    case!("GitHub ghp_, gho_, github_pat_", ["./sync", "ghp_Pw51ghpAbcdefghijklmnopqrstuvwxyz12", "gho_Pw51gho0123", "github_pat_Pw51pat_0123456789"]
        => ["./sync", "ghp_***", "gho_***", "github_pat_***"], secrets ["Pw51ghp", "Pw51gho", "Pw51pat"]),
    case!("Slack xoxb-, xoxp-", ["slack-notify", "--channel", "ops", "xoxb-1234-Pw52xoxb", "xoxp-5678-Pw52xoxp"]
        => ["slack-notify", "--channel", "ops", "xoxb-***", "xoxp-***"], secrets ["Pw52xoxb", "Pw52xoxp"]),
    case!("AWS access key id", ["aws-env", "AKIAIOSFODNN7EXAMPLE"]
        => ["aws-env", "AKIA***"], secrets ["IOSFODNN7EXAMPLE"]),
    case!("a JWT", ["curl", "https://api.example.com/hook?jwt=eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJQdzU0In0.Pw54sig"]
        => ["curl", "https://api.example.com/hook?jwt=eyJ***"], secrets ["eyJzdWIiOiJQdzU0In0", "Pw54sig"]),
    case!("a private key block", ["ssh-add", "-----BEGIN OPENSSH PRIVATE KEY-----\nPw55keyb3BlbnNzaC1rZXktdjE\n-----END OPENSSH PRIVATE KEY-----"]
        => ["ssh-add", "-----BEGIN OPENSSH PRIVATE KEY-----***"], secrets ["Pw55key"]),
    // Ordinary command lines stay readable.
    case!("ssh -p: a port", ["ssh", "-p", "2222", "deploy@bastion.example.com"] stays),
    case!("psql -p: a port", ["psql", "-h", "db", "-p", "5432", "-U", "app", "shop"] stays),
    case!("docker run -p, -u uid:gid", ["docker", "run", "--rm", "-p", "8080:80", "-u", "1000:1000", "-e", "LOG_LEVEL=debug", "nginx:1.25"] stays),
    case!("redis-cli -p: a port", ["redis-cli", "-h", "cache", "-p", "6379", "ping"] stays),
    case!("mkdir -p", ["mkdir", "-p", "build/out"] stays),
    case!("sudo mkdir -p: looked through", ["sudo", "mkdir", "-p", "cache"] stays),
    case!("cp -p", ["cp", "-p", "config.yaml", "backup.yaml"] stays),
    case!("python app.py -p <port>", ["python3", "app.py", "-p", "8080"] stays),
    case!("kubectl exec -- mkdir -p", ["kubectl", "exec", "web-0", "--", "mkdir", "-p", "tmp"] stays),
    case!("curl -p is a switch; key files", ["curl", "-p", "-x", "http://proxy:3128", "--cert", "/etc/tls/client.crt", "--key", "/etc/tls/client.key", "https://api.internal/v1/items?page=2"] stays),
    case!("openssl -inkey <file>", ["openssl", "req", "-new", "-inkey", "tls.key", "-out", "tls.csr"] stays),
    case!("a user@host, a git remote", ["git", "clone", "git@git.example.com:org/repo.git"] stays),
    case!("a token file's path", ["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"] stays),
    case!("a shell line without secrets", ["sh", "-c", "cd /app && exec ./server --port 8080 --log-level info"] stays),
    case!("a Secret's name", ["kubectl", "get", "secret", "db-credentials", "-o", "yaml"] stays),
    case!("sort -k, -u without a colon", ["sort", "-k", "2", "-u", "users.csv"] stays),
    case!("--password-stdin takes no value", ["docker", "login", "-u", "ci-bot", "--password-stdin", "registry.internal"] stays),
    case!("--password-file names a file", ["restic", "backup", "--password-file", "/run/secrets/restic", "/data"] stays),
    case!("PWD= the working directory", ["env", "PWD=/srv/app", "HOME=/root", "./run.sh"] stays),
    case!("author, bypass: not secrets", ["git", "commit", "--author=Jane Doe <jane@example.com>", "-m", "fix: bypass the cache for authors"] stays),
    case!("java -D without secrets", ["java", "-Dserver.port=8080", "-jar", "/app/app.jar"] stays),
    case!("find -path, -prune", ["find", "/data", "-path", "*/cache/*", "-prune", "-o", "-print"] stays),
    case!("ps -p <pid>", ["ps", "-p", "1234", "-o", "pid,comm"] stays),
    case!("rsync -e 'ssh -p 2222'", ["rsync", "-avp", "-e", "ssh -p 2222", "/data/", "backup@host:/srv/backup/"] stays),
    case!("kubectl port-forward", ["kubectl", "port-forward", "svc/web", "8080:80"] stays),
    case!("a TLS file name", ["ls", "-la", "/etc/ssl/private/server.key"] stays),
];
