//! The interactive SQL prompt.

use crate::client::{SqlRunner, split_statements};
use crate::output::{Format, print_results};
use rustyline::DefaultEditor;
use rustyline::error::ReadlineError;

pub async fn run(runner: &dyn SqlRunner, format: Format) -> Result<(), Box<dyn std::error::Error>> {
    let mut editor = DefaultEditor::new()?;
    let mut buffer = String::new();
    println!("Gyre SQL. End statements with ';'. \\q quits.");
    loop {
        let prompt = if buffer.is_empty() {
            "gyre> "
        } else {
            "   -> "
        };
        match editor.readline(prompt) {
            Ok(line) => {
                let trimmed = line.trim();
                if buffer.is_empty() && (trimmed == "\\q" || trimmed == "quit" || trimmed == "exit")
                {
                    return Ok(());
                }
                buffer.push_str(&line);
                buffer.push('\n');
                if !trimmed.ends_with(';') {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.trim());
                let script = std::mem::take(&mut buffer);
                let start = std::time::Instant::now();
                let outcome = async {
                    for stmt in split_statements(&script)? {
                        print_results(&runner.run(&stmt).await?, format)?;
                    }
                    Ok::<(), Box<dyn std::error::Error>>(())
                }
                .await;
                match outcome {
                    Ok(()) => println!("time: {:.3} s", start.elapsed().as_secs_f64()),
                    Err(e) => println!("error: {e}"),
                }
            }
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
