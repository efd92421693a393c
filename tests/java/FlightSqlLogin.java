// The Arrow Flight SQL JDBC driver (unchanged) logs in to Gyre and runs a query:
// java -cp flight-sql-jdbc-driver.jar FlightSqlLogin.java URL USER PASSWORD SQL
// prints the first column of the first row, or the driver's error and exits with 1.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;

public class FlightSqlLogin {
  public static void main(String[] args) {
    Properties login = new Properties();
    login.setProperty("user", args[1]);
    login.setProperty("password", args[2]);
    try (Connection c = DriverManager.getConnection(args[0], login);
        Statement s = c.createStatement();
        ResultSet r = s.executeQuery(args[3])) {
      if (!r.next()) {
        System.out.println("no rows");
        System.exit(1);
      }
      System.out.println(r.getString(1));
    } catch (SQLException e) {
      Throwable cause = e;
      StringBuilder text = new StringBuilder();
      while (cause != null) {
        text.append(cause).append('\n');
        cause = cause.getCause();
      }
      System.out.println(text);
      System.exit(1);
    }
  }
}
